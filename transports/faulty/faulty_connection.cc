#include "transports/faulty/faulty_connection.h"

#include <sys/timerfd.h>

#include <algorithm>
#include <cerrno>

#include "src/common/log.h"
#include "src/common/strcat.h"

namespace braid::transport::faulty {

namespace {
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

FaultDice::FaultDice(const FaultSpec& spec, uint64_t stream) : spec_(spec), state_(spec.seed) {
  // Two rounds so that neighbouring seeds and streams start far apart.
  state_ ^= splitmix64(state_) ^ stream;
  (void)splitmix64(state_);
}

uint64_t FaultDice::bits() {
  return splitmix64(state_);
}

double FaultDice::uniform() {
  return static_cast<double>(bits() >> 11) * 0x1p-53;
}

Fault FaultDice::next(size_t bytes) {
  Fault f;
  const double r = uniform();
  if (r < spec_.close) {
    f.kind = Fault::Kind::kCut;
    f.cutAfter = static_cast<size_t>(bits() % (bytes + 1));
  } else if (r < spec_.close + spec_.drop) {
    // Half of the drops leave a prefix: the message arrives short.
    f.kind = bytes > 0 && (bits() & 1) ? Fault::Kind::kTruncate : Fault::Kind::kDrop;
    if (f.kind == Fault::Kind::kTruncate) f.keep = static_cast<size_t>(bits() % bytes);
  } else if (r < spec_.close + spec_.drop + spec_.delay) {
    f.kind = Fault::Kind::kDelay;
    const double us = std::max(1.0, uniform() * spec_.delayMs * 1000.0);
    f.delay = std::chrono::microseconds(static_cast<int64_t>(us));
  }
  return f;
}

FaultyStream::FaultyStream(std::unique_ptr<ByteStream> inner, int peer)
    : inner_(std::move(inner)), peer_(peer) {}

void FaultyStream::cutAfter(size_t bytes) {
  if (armed_ && left_ <= bytes) return;  // an earlier cut comes first
  armed_ = true;
  left_ = bytes;
}

Status FaultyStream::cutStatus() const {
  return remoteError(strCat("the connection to rank ", peer_,
                            " was cut by an injected fault (BRAID_FAULTS close)"));
}

void FaultyStream::cutNow() {
  cut_ = true;
  armed_ = false;
  inner_->close();
}

Result<size_t> FaultyStream::writeSome(const iovec* iov, int count) {
  if (cut_) return cutStatus();
  if (!armed_) return inner_->writeSome(iov, count);
  if (left_ == 0) {
    cutNow();
    return cutStatus();
  }
  // Only the bytes before the cut go out.
  std::vector<iovec> part;
  size_t room = left_;
  for (int i = 0; i < count && room > 0; ++i) {
    const size_t take = std::min(room, iov[i].iov_len);
    part.push_back({iov[i].iov_base, take});
    room -= take;
  }
  auto wrote = inner_->writeSome(part.data(), static_cast<int>(part.size()));
  if (!wrote.isOk()) return wrote;
  left_ -= *wrote;
  if (left_ == 0) cutNow();
  return wrote;
}

Result<size_t> FaultyStream::readSome(void* into, size_t room) {
  if (cut_) return cutStatus();
  return inner_->readSome(into, room);
}

void FaultyStream::writeLast(const iovec* iov, int count) {
  // A stream about to be cut dies before its last word.
  if (cut_ || armed_) return;
  inner_->writeLast(iov, count);
}

bool FaultyStream::prepareToSleep(bool sendsPending) {
  if (cut_) return false;  // the caller must see the cut, not sleep on it
  return inner_->prepareToSleep(sendsPending);
}

Status FaultyStream::readPeer(void* into, uint64_t address, uint64_t key, size_t bytes) {
  if (cut_) return cutStatus();
  return inner_->readPeer(into, address, key, bytes);
}

FaultyConnection::FaultyConnection(std::unique_ptr<Connection> inner, FaultyStream* stream,
                                   const FaultSpec& spec, int rank)
    : inner_(std::move(inner)),
      stream_(stream),
      dice_(spec,
            uint64_t{static_cast<uint32_t>(rank)} << 32 | static_cast<uint32_t>(inner_->peer())) {}

FaultyConnection::~FaultyConnection() {
  abort(Status(ErrorCode::kOk, "connection closed"));
}

void FaultyConnection::cut(size_t afterBytes) {
  if (stream_) {
    stream_->cutAfter(afterBytes);
  } else {
    inner_->abort(Status(ErrorCode::kOk, "connection closed by an injected fault"));
  }
}

RequestPtr FaultyConnection::postSend(const void* data, size_t bytes, Tag tag) {
  std::lock_guard lock(mutex_);
  ++counts_.messages;
  const Fault fault = dice_.next(bytes);
  auto due = Clock::now();
  switch (fault.kind) {
    case Fault::Kind::kDrop: {
      // Gone without a trace: the sender is told it was sent.
      ++counts_.dropped;
      BRAID_INFO("injected fault: dropped a message of ", bytes, " bytes to rank ", peer());
      auto request = std::make_shared<Request>();
      request->complete();
      return request;
    }
    case Fault::Kind::kTruncate:
      ++counts_.truncated;
      BRAID_INFO("injected fault: a message of ", bytes, " bytes to rank ", peer(), " is cut to ",
                 fault.keep);
      bytes = fault.keep;
      break;
    case Fault::Kind::kCut:
      ++counts_.cut;
      BRAID_INFO("injected fault: the connection to rank ", peer(), " is cut within ",
                 fault.cutAfter, " bytes");
      cut(fault.cutAfter);
      break;
    case Fault::Kind::kDelay:
      if (!timer_.valid())
        timer_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
      if (!timer_.valid()) break;  // no timer, no delay: sent at once
      ++counts_.delayed;
      due += fault.delay;
      break;
    case Fault::Kind::kNone:
      break;
  }
  if (held_.empty() && due <= Clock::now()) return inner_->postSend(data, bytes, tag);
  // Later messages wait behind a held one: the connection keeps order.
  if (!held_.empty()) due = std::max(due, held_.back().due);
  auto request = std::make_shared<Request>();
  held_.push_back({data, bytes, tag, request, due});
  if (held_.size() == 1) armTimer();
  return request;
}

void FaultyConnection::armTimer() {
  itimerspec when{};
  if (!held_.empty()) {
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(held_.front().due.time_since_epoch())
            .count();
    // steady_clock is CLOCK_MONOTONIC; a zero it_value would disarm.
    when.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
    when.it_value.tv_nsec = static_cast<long>(std::max<int64_t>(ns % 1000000000, 1));
  }
  (void)::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &when, nullptr);
}

bool FaultyConnection::releaseDue(Clock::time_point now) {
  bool released = false;
  while (!held_.empty() && held_.front().due <= now) {
    Held& h = held_.front();
    relays_.push_back({h.request, inner_->postSend(h.data, h.bytes, h.tag)});
    relays_.back().inner->watch();  // completed by whichever thread progresses inner_
    held_.pop_front();
    released = true;
  }
  if (released) armTimer();  // for the next one, or disarmed (and drained)
  return released;
}

void FaultyConnection::settleRelays() {
  for (size_t i = 0; i < relays_.size();) {
    const Relay& r = relays_[i];
    const Request::State state = r.inner->state();
    if (state == Request::State::kPending) {
      ++i;
      continue;
    }
    if (state == Request::State::kDone)
      r.outer->complete();
    else
      r.outer->fail(r.inner->error(), r.inner->failure(), r.inner->mismatch());
    relays_[i] = std::move(relays_.back());
    relays_.pop_back();
  }
}

Result<bool> FaultyConnection::progress() {
  std::lock_guard lock(mutex_);
  const bool released = releaseDue(Clock::now());
  auto progressed = inner_->progress();
  if (!progressed.isOk()) {
    // Dead: the held messages fail as every other send does.
    releaseDue(Clock::time_point::max());
  }
  settleRelays();
  if (!progressed.isOk()) return progressed.status();
  return *progressed || released;
}

int FaultyConnection::pollFd() const {
  std::lock_guard lock(mutex_);
  return held_.empty() ? inner_->pollFd() : timer_.get();
}

bool FaultyConnection::ended() const {
  std::lock_guard lock(mutex_);
  return held_.empty() && inner_->ended();
}

bool FaultyConnection::wantsWrite() const {
  std::lock_guard lock(mutex_);
  return held_.empty() && inner_->wantsWrite();
}

bool FaultyConnection::prepareToSleep() {
  std::lock_guard lock(mutex_);
  if (!held_.empty()) return held_.front().due > Clock::now();
  return inner_->prepareToSleep();
}

void FaultyConnection::abort(const Status& reason) {
  abortInCall(reason, 0);
}

void FaultyConnection::abortInCall(const Status& reason, uint64_t callMark) {
  std::lock_guard lock(mutex_);
  inner_->abortInCall(reason, callMark);
  releaseDue(Clock::time_point::max());
  settleRelays();
}

FaultyConnection::Counts FaultyConnection::counts() const {
  std::lock_guard lock(mutex_);
  return counts_;
}

FaultyStream* wrapStream(std::unique_ptr<ByteStream>& stream, const FaultSpec& spec, int peer) {
  if (!spec.enabled()) return nullptr;
  auto wrapped = std::make_unique<FaultyStream>(std::move(stream), peer);
  FaultyStream* raw = wrapped.get();
  stream = std::move(wrapped);
  return raw;
}

void wrapConnection(std::unique_ptr<Connection>& connection, FaultyStream* stream,
                    const FaultSpec& spec, int rank) {
  if (!spec.enabled()) return;
  connection = std::make_unique<FaultyConnection>(std::move(connection), stream, spec, rank);
}

}  // namespace braid::transport::faulty
