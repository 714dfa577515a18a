#include "transports/stream_connection.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "src/common/strcat.h"
#include "transports/stream_frames.h"

namespace braid::transport {

namespace {
constexpr size_t kStagingBytes = 256 << 10;
// Payloads at least this large bypass the staging buffer.
constexpr size_t kDirectBytes = 32 << 10;
constexpr int kMaxIov = 64;  // IOV_MAX is 1024; 64 frames per write is plenty

// Where a payload with no receive posted starts, unless it is smaller.
constexpr size_t kFirstSpillBytes = 64 << 10;
// Payloads up to this size with no receive posted get their whole size at
// once (a Send's pieces, which come one after another).
constexpr size_t kWholeSpillBytes = 8 << 20;

// The size for a buffer of `capacity` bytes that must hold `needed`: at
// least double, so that a large payload is moved a few times at most, but
// never beyond `total`, the payload's size.
size_t grownCapacity(size_t capacity, size_t needed, size_t total) {
  // Up to kWholeSpillBytes the whole payload at once: growing moves it, and
  // untouched pages of a fresh allocation cost nothing.
  if (total <= kWholeSpillBytes) return total;
  return std::min(total, std::max({needed, 2 * capacity, kFirstSpillBytes}));
}
}  // namespace

bool StreamConnection::Payload::reserve(size_t n) {
  if (n <= capacity) return true;
  // realloc: large blocks move by remapping their pages, not by copying.
  void* grown = std::realloc(bytes.get(), n);
  if (!grown) return false;
  (void)bytes.release();
  bytes.reset(static_cast<uint8_t*>(grown));
  capacity = n;
  return true;
}

StreamConnection::StreamConnection(std::unique_ptr<ByteStream> stream, int peer)
    : StreamConnection(std::move(stream), peer, Options()) {}

StreamConnection::StreamConnection(std::unique_ptr<ByteStream> stream, int peer, Options options)
    : stream_(std::move(stream)), peer_(peer), options_(options), staging_(kStagingBytes) {}

StreamConnection::~StreamConnection() {
  abort(Status(ErrorCode::kOk, "connection closed"));
}

namespace {
constexpr size_t kGoodbyeMessageBytes = 512;

// Payload bytes that follow a header in the stream.
uint64_t inlineBytes(uint64_t tag, uint64_t bytes, uint64_t remote) {
  const bool ack = channelBase(tag) == kControlChannel && tag != kGoodbyeTag;
  return remote != 0 || ack ? 0 : bytes;
}
bool isDescriptor(uint64_t tag, uint64_t remote) {
  return remote != 0 && channelBase(tag) != kControlChannel;
}
}  // namespace

Status StreamConnection::deadStatus() const {
  return dead_;
}

RequestPtr StreamConnection::postSend(const void* data, size_t bytes, Tag tag) {
  auto request = std::make_shared<Request>();
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) {
    request->fail(dead_);
    return request;
  }
  uint64_t remote = 0, key = 0;
  if (options_.readPeerBytes > 0 && bytes >= options_.readPeerBytes && data &&
      stream_->canReadPeer())
    if (const auto readable = stream_->peerReadKey(data, bytes)) {
      remote = reinterpret_cast<uintptr_t>(data);
      key = *readable;
    }
  sends_.push_back(
      {{tag.value, tag.check, bytes, remote, key}, static_cast<const uint8_t*>(data), 0, request});
  sendsPending_ = true;
  return request;
}

void StreamConnection::deliver(const PostedRecv& p, const uint8_t* payload) {
  if (p.bytes == 0) return;
  if (p.reduces())
    p.combiner.apply(p.data, p.local, payload, p.bytes / p.combiner.unit, p.combiner.context);
  else
    std::memcpy(p.data, payload, p.bytes);
}

void StreamConnection::combineArriving(const uint8_t* in, size_t n) {
  const Combiner& c = matched_->combiner;
  size_t at = payloadGot_;  // payload bytes consumed before `in`
  if (const size_t part = at % c.unit; part != 0) {
    const size_t fill = std::min(n, c.unit - part);
    std::memcpy(carry_ + part, in, fill);
    in += fill;
    n -= fill;
    at += fill;
    if (at % c.unit != 0) return;
    const size_t element = at - c.unit;
    c.apply(matched_->data + element, matched_->local + element, carry_, 1, c.context);
  }
  const size_t whole = n / c.unit * c.unit;
  if (reinterpret_cast<uintptr_t>(in) % c.unit == 0) {
    if (whole) c.apply(matched_->data + at, matched_->local + at, in, whole / c.unit, c.context);
  } else {
    // Frames of odd sizes before this one leave the payload misaligned in
    // the staging buffer; the kernels load whole elements, so they get an
    // aligned copy, a cache-sized piece at a time.
    for (size_t done = 0; done < whole;) {
      const size_t piece = std::min(whole - done, sizeof(aligned_) / c.unit * c.unit);
      std::memcpy(aligned_, in + done, piece);
      c.apply(matched_->data + at + done, matched_->local + at + done, aligned_, piece / c.unit,
              c.context);
      done += piece;
    }
  }
  if (n > whole) std::memcpy(carry_, in + whole, n - whole);
}

RequestPtr StreamConnection::postRecv(void* data, size_t bytes, Tag tag) {
  return postRecvReduce(data, nullptr, bytes, tag, {});
}

RequestPtr StreamConnection::postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                                            const Combiner& combiner) {
  auto request = std::make_shared<Request>();
  PostedRecv posted{static_cast<uint8_t*>(dst),         bytes,   tag.check, request,
                    static_cast<const uint8_t*>(local), combiner};
  std::lock_guard lock(mutex_);
  // A message that arrived before the peer closed is still delivered.
  if (auto it = unexpected_.find(tag.value); it != unexpected_.end()) {
    Unexpected& u = it->second;
    const bool matches = u.check == tag.check && u.bytes == bytes;
    if (u.remote != 0) {
      --unexpectedDescriptors_;
      if (matches && dead_.isOk()) {
        posted.remote = u.remote;
        posted.remoteKey = u.remoteKey;
        posted_[tag.value] = posted;
        pulls_.push_back(tag.value);
        unexpected_.erase(it);
        unexpectedCount_.store(unexpected_.size(), std::memory_order_relaxed);
        return request;
      }
      // The sender may have its buffer back: nobody will copy it now.
      if (!matches && dead_.isOk()) queueAck(tag.value, u.remote, nullptr);
    }
    if (!matches) {
      request->fail(invalidUsage(strCat("message from rank ", peer_, " does not match")),
                    Request::Failure::kDifferentCall, Tag{tag.value, u.check});
    } else if (u.remote != 0) {
      // Its sender's buffer is no longer promised to be there.
      request->fail(dead_);
    } else {
      deliver(posted, u.payload.data());
      request->complete();
    }
    unexpected_.erase(it);
    unexpectedCount_.store(unexpected_.size(), std::memory_order_relaxed);
    return request;
  }
  if (!dead_.isOk()) {
    request->fail(dead_);
    return request;
  }
  bool arriving = inPayload_ && !matched_ && header_.tag == tag.value;
  if (const auto later = latestArrived_.after(tag.value); !arriving && later) {
    // The peer already sent something later in this channel: this message
    // will never come, the two ranks called different things.
    request->fail(invalidUsage(strCat("rank ", peer_, " moved past this message")),
                  Request::Failure::kOvertaken, Tag{*later, 0});
    return request;
  }
  PostedRecv& entry = posted_[tag.value] = posted;
  if (arriving && entry.check == header_.check && entry.bytes == header_.bytes) adopt(entry);
  return request;
}

void StreamConnection::adopt(PostedRecv& posted) {
  // The bytes so far go where they belong, then the rest follows them
  // there as it arrives. Left to the end, the whole payload went through
  // memory of its own first: for a 32 MiB message over the rings, a second
  // copy and 8192 fresh pages per call, at half the speed.
  matched_ = &posted;
  target_ = posted.data;
  const size_t got = payloadGot_;
  if (posted.reduces()) {
    payloadGot_ = 0;  // combineArriving counts from the payload's start
    combineArriving(spill_.data(), got);
    payloadGot_ = got;
  } else if (got > 0) {
    std::memcpy(posted.data, spill_.data(), got);
  }
  spill_ = {};
}

Result<bool> StreamConnection::progress() {
  std::lock_guard lock(mutex_);
  return progressLocked(options_.unclaimedDescriptorWait);
}

Result<bool> StreamConnection::progressLocked(std::chrono::microseconds unclaimedWait) {
  if (!dead_.isOk()) return dead_;
  BRAID_ASSIGN_OR_RETURN(bool sent, sendSome());
  // A push asked for goes out before this end starts on its own part.
  if (askForPushes()) {
    BRAID_ASSIGN_OR_RETURN(bool asked, sendSome());
    sent = sent || asked;
  }
  const size_t framesBefore = sends_.size();
  BRAID_RETURN_IF_ERROR(copyOutUnclaimed(unclaimedWait));
  BRAID_ASSIGN_OR_RETURN(bool pulled, pullSome());
  // Reading before any ack goes out is what makes the copies good: a sender
  // that gives up says so in the stream before its send fails (and its
  // buffer may be reused), so no goodbye here means the copies read a
  // buffer still promised to this rank.
  BRAID_ASSIGN_OR_RETURN(bool received, recvSome());
  unconfirmed_.clear();
  // Likewise, writing only after reading: a receiver that gave up has said
  // so by now, and its buffer is no longer written.
  BRAID_ASSIGN_OR_RETURN(bool pushed, pushSome());
  if (sends_.size() != framesBefore || pulled || pushed) {
    BRAID_ASSIGN_OR_RETURN(bool acked, sendSome());
    sent = sent || acked;
  }
  return sent || pulled || received || pushed;
}

Result<bool> StreamConnection::sendSome() {
  bool moved = false;
  while (!sends_.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = sends_.begin(); it != sends_.end() && n + 2 <= kMaxIov; ++it) {
      size_t skip = it->sent;
      const size_t headerBytes = sizeof(FrameHeader);
      if (skip < headerBytes) {
        iov[n++] = {reinterpret_cast<uint8_t*>(&it->header) + skip, headerBytes - skip};
        skip = 0;
      } else {
        skip -= headerBytes;
      }
      const FrameHeader& h = it->header;
      if (const uint64_t payload = inlineBytes(h.tag, h.bytes, h.remote); payload > skip)
        iov[n++] = {const_cast<uint8_t*>(it->data) + skip, payload - skip};
    }
    auto wrote = stream_->writeSome(iov, n);
    if (!wrote.isOk()) {
      failAll(wrote.status());
      return wrote.status();
    }
    if (*wrote == 0) break;
    moved = true;
    size_t left = *wrote;
    while (left > 0) {
      PendingSend& front = sends_.front();
      const FrameHeader& h = front.header;
      const size_t total = sizeof(FrameHeader) + inlineBytes(h.tag, h.bytes, h.remote);
      const size_t take = std::min(left, total - front.sent);
      front.sent += take;
      left -= take;
      if (front.sent < total) {
        // The frames behind it go as soon as it has, whatever the peer does
        // (another stream's large message may be ahead of a call's).
        for (const PendingSend& s : sends_)
          if (s.request) s.request->noteProgress();
        break;
      }
      if (isDescriptor(h.tag, h.remote))
        awaitingAck_.push_back(std::move(front));
      else if (front.request)
        front.request->complete();
      sends_.pop_front();
    }
  }
  sendsPending_ = !sends_.empty();
  return moved;
}

void StreamConnection::failPostedBefore(uint64_t tag, const Tag& arrived) {
  rangesBefore(tag, [&](uint64_t first, uint64_t last) {
    for (auto it = posted_.lower_bound(first); it != posted_.end() && it->first <= last;) {
      if (it->second.remote != 0) {  // its message has arrived: it is being copied
        ++it;
        continue;
      }
      it->second.request->fail(invalidUsage(strCat("rank ", peer_, " moved past this message")),
                               Request::Failure::kOvertaken, arrived);
      it = posted_.erase(it);
    }
  });
}

void StreamConnection::headerArrived() {
  if (header_.tag == kAckTag) {
    ackArrived();
    headerGot_ = 0;
  } else if (header_.tag == kPushTag) {
    pushRequested();
    headerGot_ = 0;
  } else if (header_.tag == kPushedTag) {
    pushAnswered();
    headerGot_ = 0;
  } else if (isDescriptor(header_.tag, header_.remote)) {
    descriptorArrived();
    headerGot_ = 0;
  } else {
    startFrame();
    if (header_.bytes == 0) finishFrame();
  }
}

void StreamConnection::startFrame() {
  inPayload_ = true;
  payloadGot_ = 0;
  matched_ = nullptr;
  spill_ = {};
  target_ = nullptr;
  if (channelBase(header_.tag) == kControlChannel) {
    header_.bytes = std::min<uint64_t>(header_.bytes, kGoodbyeMessageBytes);
    return;
  }
  const Tag arrived{header_.tag, header_.check};
  latestArrived_.arrived(header_.tag);
  failPostedBefore(header_.tag, arrived);
  if (auto it = posted_.find(header_.tag); it != posted_.end()) {
    PostedRecv& p = it->second;
    if (p.check == header_.check && p.bytes == header_.bytes) {
      matched_ = &p;
      target_ = p.data;
      return;
    }
    p.request->fail(invalidUsage(strCat("message from rank ", peer_, " does not match (",
                                        header_.bytes, " bytes arrived, ", p.bytes, " expected)")),
                    Request::Failure::kDifferentCall, arrived);
    posted_.erase(it);
  }
}

bool StreamConnection::spillRoom(size_t n) {
  if (n > spill_.capacity && !spill_.reserve(grownCapacity(spill_.capacity, n, header_.bytes))) {
    closeWith(systemError(
        strCat("out of memory for a message of ", header_.bytes, " bytes from rank ", peer_)));
    return false;
  }
  target_ = spill_.data();
  return true;
}

void StreamConnection::finishFrame() {
  if (channelBase(header_.tag) == kControlChannel) {
    std::string why(spill_.data(), spill_.data() + header_.bytes);
    // Only a mismatch is the peer's verdict on this call too; anything else
    // means the peer failed or left.
    const auto code = static_cast<ErrorCode>(header_.check);
    // The reason is the peer's bytes: an empty one must still explain.
    const bool said = !why.empty();
    Status s = code == ErrorCode::kInvalidUsage
                   ? invalidUsage(
                         said ? why : strCat("rank ", peer_, " found that the calls do not match"))
                   : remoteError(strCat("rank ", peer_,
                                        " ended the connection: ", said ? why : "no reason given"));
    if (code != ErrorCode::kOk && !peerFailed_) {
      peerFailure_ = s;
      peerFailedCall_ = header_.key;
      peerFailed_ = true;
    }
    failAll(s);
    inPayload_ = false;
    headerGot_ = 0;
    return;
  }
  if (matched_) {
    matched_->request->complete();
    posted_.erase(header_.tag);
  } else {
    // A receive posted while the payload was arriving took it over
    // (adopt) unless it did not match.
    if (auto it = posted_.find(header_.tag); it != posted_.end()) {
      it->second.request->fail(invalidUsage(strCat("message from rank ", peer_, " does not match")),
                               Request::Failure::kDifferentCall, Tag{header_.tag, header_.check});
      posted_.erase(it);
    } else {
      unexpected_[header_.tag] = {header_.check, header_.bytes, std::move(spill_)};
      unexpectedCount_.store(unexpected_.size(), std::memory_order_relaxed);
    }
    spill_ = {};
  }
  inPayload_ = false;
  headerGot_ = 0;
  matched_ = nullptr;
}

Result<bool> StreamConnection::recvSome() {
  bool moved = false;
  while (true) {
    // Consume what is staged.
    while (stagingBegin_ < stagingEnd_ && dead_.isOk()) {
      size_t avail = stagingEnd_ - stagingBegin_;
      if (!inPayload_) {
        size_t take = std::min(avail, sizeof(FrameHeader) - headerGot_);
        std::memcpy(reinterpret_cast<uint8_t*>(&header_) + headerGot_, &staging_[stagingBegin_],
                    take);
        headerGot_ += take;
        stagingBegin_ += take;
        if (headerGot_ == sizeof(FrameHeader)) headerArrived();
      } else {
        size_t take = std::min(avail, header_.bytes - payloadGot_);
        if (matched_) matched_->request->noteProgress();
        if (matched_ && matched_->reduces()) {
          combineArriving(&staging_[stagingBegin_], take);
        } else {
          if (!matched_ && !spillRoom(payloadGot_ + take)) break;
          std::memcpy(target_ + payloadGot_, &staging_[stagingBegin_], take);
        }
        payloadGot_ += take;
        stagingBegin_ += take;
        if (payloadGot_ == header_.bytes && finishFrameAndStop()) return true;
      }
    }
    if (!dead_.isOk()) return dead_;
    stagingBegin_ = stagingEnd_ = 0;
    uint8_t* into = staging_.data();
    size_t room = staging_.size();
    // A payload to be reduced goes through staging, which stays in cache.
    const bool reducing = matched_ && matched_->reduces();
    bool direct = inPayload_ && !reducing && header_.bytes - payloadGot_ >= kDirectBytes;
    // Up to a header, a read takes the rest of a small payload, a header
    // and a small payload's worth, so a small message still comes in one
    // read: the whole of staging would pull in the start of the next large
    // payload, to be copied out again (half of each 512 KiB piece of a
    // large Send, once they came one after another).
    if (!inPayload_ || (!reducing && !direct)) {
      const size_t rest = inPayload_ ? header_.bytes - payloadGot_ : 0;
      room = std::min(room, rest + sizeof(FrameHeader) + kDirectBytes);
    }
    if (direct) {
      room = header_.bytes - payloadGot_;
      if (!matched_) {
        if (!spillRoom(payloadGot_ + kDirectBytes)) return dead_;
        room = std::min(room, spill_.capacity - payloadGot_);
      }
      into = target_ + payloadGot_;
    }
    auto got = stream_->readSome(into, room);
    if (!got.isOk()) {
      failAll(got.status());
      return got.status();
    }
    if (*got == 0) return moved;
    moved = true;
    if (direct) {
      if (matched_) matched_->request->noteProgress();
      payloadGot_ += *got;
      if (payloadGot_ == header_.bytes && finishFrameAndStop()) return true;
    } else {
      stagingEnd_ = *got;
    }
  }
}

bool StreamConnection::finishFrameAndStop() {
  const bool answered = matched_ != nullptr;
  finishFrame();
  return answered && posted_.empty() && sends_.empty() && awaitingAck_.empty() && pulls_.empty() &&
         pushes_.empty() && stagingBegin_ == stagingEnd_;
}

void StreamConnection::failAll(const Status& reason) {
  if (dead_.isOk()) dead_ = reason;
  for (auto& s : sends_)
    if (s.request) s.request->fail(reason);
  sends_.clear();
  sendsPending_ = false;
  for (auto& s : awaitingAck_) s.request->fail(reason);
  awaitingAck_.clear();
  for (auto& [tag, p] : posted_) p.request->fail(reason);
  posted_.clear();
  pulls_.clear();
  pushes_.clear();
  // Copied from a buffer the peer may have taken back before saying so.
  for (uint64_t tag : unconfirmed_) unexpected_.erase(tag);
  unexpectedCount_.store(unexpected_.size(), std::memory_order_relaxed);
  unconfirmed_.clear();
}

void StreamConnection::closeWith(const Status& reason, uint64_t callMark) {
  // Say goodbye unless a frame is half written (that would break framing)
  // or the connection is already dead. Best effort: never blocks.
  bool midFrame = !sends_.empty() && sends_.front().sent > 0;
  if (dead_.isOk() && !midFrame) {
    std::string why = reason.message().substr(0, kGoodbyeMessageBytes);
    FrameHeader goodbye{kGoodbyeTag, static_cast<uint64_t>(reason.code()), why.size(), 0, callMark};
    iovec iov[2] = {{&goodbye, sizeof(goodbye)}, {why.data(), why.size()}};
    stream_->writeLast(iov, 2);
  }
  // Closed before any send fails: the peer must see the end of the stream
  // before a failed send's buffer can be reused under a copy of it.
  stream_->close();
  failAll(reason.isOk() ? remoteError(reason.message()) : reason);
}

void StreamConnection::abort(const Status& reason) {
  std::lock_guard lock(mutex_);
  closeWith(reason);
}

void StreamConnection::abortInCall(const Status& reason, uint64_t callMark) {
  std::lock_guard lock(mutex_);
  closeWith(reason, callMark);
}

bool StreamConnection::prepareToSleep() {
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) return true;
  if (!pulls_.empty() || !pushes_.empty()) return false;  // copying needs no wake-up
  // Both ends idle, each holding the other's descriptor: each may wait for
  // its send before it posts the receive, so neither waits any longer.
  if (unexpectedDescriptors_ > 0 && !awaitingAck_.empty()) {
    (void)progressLocked(std::chrono::microseconds(0));
    return false;
  }
  // A caller progresses only the connections it has requests on, and one
  // it has none on may hold a sender waiting for an ack: a descriptor that
  // came in or went stale is taken care of here, before the caller sleeps.
  if (holdsUnclaimed(options_.unclaimedDescriptorWait) ||
      !stream_->prepareToSleep(!sends_.empty())) {
    (void)progressLocked(options_.unclaimedDescriptorWait);
    return false;
  }
  return true;
}

bool StreamConnection::ended() const {
  std::lock_guard lock(mutex_);
  return !dead_.isOk();
}

Status StreamConnection::peerFailure() const {
  return peerFailed_.load(std::memory_order_acquire) ? peerFailure_ : Status::ok();
}

uint64_t StreamConnection::peerFailedCall() const {
  return peerFailed_.load(std::memory_order_acquire) ? peerFailedCall_ : 0;
}

void StreamConnection::forgetArrivalsBefore(uint64_t tag) {
  std::lock_guard lock(mutex_);
  latestArrived_.forgetBefore(tag);
}

std::optional<Tag> StreamConnection::unclaimed(uint8_t channel, uint64_t below) {
  std::lock_guard lock(mutex_);
  // A bound of another channel than `channel` would be the caller's mistake.
  if (channelOf(below) != channel) return std::nullopt;
  auto it = firstBefore(unexpected_, below);
  if (it == unexpected_.end()) return std::nullopt;
  return Tag{it->first, it->second.check};
}

}  // namespace braid::transport
