#include "transports/gpu_staged/staged_connection.h"

#include <algorithm>
#include <utility>

#include "src/common/log.h"
#include "src/common/strcat.h"
#include "transports/channel_order.h"

namespace braid::transport::gpu_staged {

StagedConnection::StagedConnection(Connection& host, std::shared_ptr<cuda_ipc::IpcDevice> device,
                                   Options options)
    : host_(host), device_(std::move(device)), options_(options) {}

StagedConnection::~StagedConnection() {
  // Queued copies still read or write the bounce buffers: they run first.
  // The host connection is not this one's to close.
  (void)device_->synchronize();
}

std::optional<StagedConnection::Bounce> StagedConnection::takeFree(Pool& pool, size_t bytes) {
  auto it = pool.free.lower_bound(bytes);
  if (it == pool.free.end()) return std::nullopt;
  Bounce b = std::move(it->second);
  pool.free.erase(it);
  return b;
}

bool StagedConnection::hasRoom(const Pool& pool, size_t bytes) const {
  // A buffer in use comes back; one that would fit none never does.
  return pool.sizes.size() < static_cast<size_t>(options_.bouncesPerDirection) ||
         pool.sizes.empty() || *pool.sizes.rbegin() < bytes;
}

Result<StagedConnection::Bounce> StagedConnection::allocateBounce(size_t bytes) {
  const size_t size = std::max(bytes, options_.minBounceBytes);
  BRAID_ASSIGN_OR_RETURN(auto memory, device_->allocateHost(size));
  return Bounce{std::move(memory), size};
}

Result<StagedConnection::Bounce> StagedConnection::pinBounce(Pool& pool, size_t bytes) {
  BRAID_ASSIGN_OR_RETURN(Bounce bounce, allocateBounce(bytes));
  count(pool, bounce);
  return bounce;
}

void StagedConnection::count(Pool& pool, const Bounce& bounce) {
  ++bounceBuffers_;
  pool.sizes.insert(bounce.bytes);
  BRAID_TRACE("gpu_staged: pinned a bounce buffer of ", bounce.bytes, " bytes for ",
              &pool == &sendPool_ ? "sends to" : "receives from", " rank ", host_.peer(), ", ",
              pool.sizes.size(), " that way now");
}

void StagedConnection::keep(Pool& pool, Bounce bounce) {
  count(pool, bounce);
  giveBack(pool, std::move(bounce));
}

void StagedConnection::giveBack(Pool& pool, Bounce bounce) {
  if (!bounce.memory) return;
  pool.free.emplace(bounce.bytes, std::move(bounce));
  ++bouncesReturned_;
}

void StagedConnection::retire(Pool& pool, Bounce bounce) {
  if (!bounce.memory) return;
  pool.sizes.erase(pool.sizes.find(bounce.bytes));
  retired_.push_back(std::move(bounce));
}

std::vector<size_t> StagedConnection::missingBuffers(Pool& pool, std::span<const size_t> sizes) {
  if (sizes.empty()) return {};
  pool.reserved = true;
  const auto most = static_cast<size_t>(options_.bouncesPerDirection);
  // Made already (each call after the first): when the n-th largest buffer
  // fits the largest message, so does each of the n largest.
  const size_t n = std::min(sizes.size(), most);
  const size_t largest = *std::max_element(sizes.begin(), sizes.end());
  if (pool.sizes.size() >= n &&
      *std::next(pool.sizes.rbegin(), static_cast<std::ptrdiff_t>(n) - 1) >= largest)
    return {};
  std::vector<size_t> wanted(sizes.begin(), sizes.end());
  std::sort(wanted.begin(), wanted.end(), std::greater<>());
  wanted.resize(n);
  // The largest wanted takes the largest buffer, and so on down; what no
  // buffer is left for is missing.
  const std::vector<size_t> owned(pool.sizes.rbegin(), pool.sizes.rend());
  std::vector<size_t> missing;
  size_t next = 0;
  for (size_t bytes : wanted) {
    if (next < owned.size() && owned[next] >= bytes)
      ++next;
    else if (bytes > 0)
      missing.push_back(bytes);
  }
  return missing;
}

Status StagedConnection::reserve(std::span<const size_t> sends, std::span<const size_t> recvs) {
  for (auto [pool, sizes] : {std::pair{&sendPool_, sends}, std::pair{&recvPool_, recvs}}) {
    std::vector<size_t> missing;
    {
      std::lock_guard lock(mutex_);
      // A dead connection fails the call's posts, with its own reason.
      if (!dead_.isOk()) return Status::ok();
      missing = missingBuffers(*pool, sizes);
    }
    // Pinned without the lock: pinning waits for the driver's memory lock,
    // which an application thread may hold until a CUDA stream gets past
    // the call that runs now, and that call needs this connection.
    for (size_t bytes : missing) {
      BRAID_ASSIGN_OR_RETURN(Bounce bounce, allocateBounce(bytes));
      std::lock_guard lock(mutex_);
      keep(*pool, std::move(bounce));
    }
  }
  return Status::ok();
}

Result<std::unique_ptr<cuda_ipc::DeviceEvent>> StagedConnection::takeEvent() {
  if (!freeEvents_.empty()) {
    auto e = std::move(freeEvents_.back());
    freeEvents_.pop_back();
    return e;
  }
  return device_->createUnsharedEvent();
}

void StagedConnection::giveBack(std::unique_ptr<cuda_ipc::DeviceEvent> event) {
  if (event) freeEvents_.push_back(std::move(event));
}

RequestPtr StagedConnection::failed(Status error) {
  auto request = std::make_shared<Request>();
  request->fail(std::move(error));
  return request;
}

Result<bool> StagedConnection::startSend(Send& s) {
  if (s.bytes == 0) return true;
  Bounce bounce;
  if (auto free = takeFree(sendPool_, s.bytes)) {
    bounce = std::move(*free);
  } else if (hasRoom(sendPool_, s.bytes)) {
    BRAID_ASSIGN_OR_RETURN(bounce, pinBounce(sendPool_, s.bytes));
  } else {
    return false;  // an earlier send's comes back once it has left
  }
  auto event = takeEvent();
  if (!event.isOk()) {
    giveBack(sendPool_, std::move(bounce));
    return event.status();
  }
  Status queued = device_->enqueueCopy(bounce.data(), s.data, s.bytes);
  if (queued.isOk()) queued = device_->enqueueRecord(**event);
  if (!queued.isOk()) {
    // The copy may be queued: the bounce buffer is not reused.
    giveBack(std::move(*event));
    retire(sendPool_, std::move(bounce));
    return queued;
  }
  s.bounce = std::move(bounce);
  s.copied = std::move(*event);
  return true;
}

RequestPtr StagedConnection::postSend(const void* data, size_t bytes, Tag tag) {
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) return failed(dead_);
  Send s;
  s.request = std::make_shared<Request>();
  s.data = data;
  s.bytes = bytes;
  s.tag = tag;
  // Buffers go to sends in their order: one taken past a send that waits
  // could not leave before it.
  if (sendsWaiting_ > 0) {
    s.waiting = true;
  } else {
    auto started = startSend(s);
    if (!started.isOk()) return failed(started.status());
    s.waiting = !*started;
  }
  sendsWaiting_ += s.waiting;
  RequestPtr request = s.request;
  sends_.push_back(std::move(s));
  return request;
}

RequestPtr StagedConnection::postRecv(void* data, size_t bytes, Tag tag) {
  return postRecvReduce(data, nullptr, bytes, tag, Combiner{});
}

bool StagedConnection::RecvHolders::mayWait(const Recv& r) const {
  if (largestArrived >= r.bytes) return true;
  for (const Pending& p : pending)
    if (p.tag.channel() == r.tag.channel() && tagBefore(p.tag.value, r.tag.value) &&
        p.bytes >= r.bytes)
      return true;
  return false;
}

StagedConnection::RecvHolders StagedConnection::recvHolders() const {
  RecvHolders h;
  for (const Recv& r : recvs_) {
    if (!r.bounce.memory) continue;
    if (r.onHost->state() == Request::State::kPending)
      h.pending.push_back({r.tag, r.bounce.bytes});
    else  // its buffer comes back once the device has copied it out
      h.largestArrived = std::max(h.largestArrived, r.bounce.bytes);
  }
  return h;
}

Result<bool> StagedConnection::startRecv(Recv& r, RecvHolders& holders) {
  Bounce bounce;
  if (r.bytes > 0) {
    if (auto free = takeFree(recvPool_, r.bytes)) {
      bounce = std::move(*free);
    } else if (recvPool_.reserved && holders.largestArrived >= r.bytes) {
      // One comes back without the peer's help: a call reserved for (one
      // of an earlier call, still being copied out) pins nothing more.
      return false;
    } else if (hasRoom(recvPool_, r.bytes) || !holders.mayWait(r)) {
      BRAID_ASSIGN_OR_RETURN(bounce, pinBounce(recvPool_, r.bytes));
    } else {
      return false;
    }
    holders.pending.push_back({r.tag, bounce.bytes});
  }
  r.bounce = std::move(bounce);
  r.onHost = host_.postRecv(r.bounce.data(), r.bytes, r.tag);
  r.onHost->watch();  // host_ may be shared: another thread may complete it
  return true;
}

RequestPtr StagedConnection::postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                                            const Combiner& combiner) {
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) return failed(dead_);
  Recv r;
  r.request = std::make_shared<Request>();
  r.tag = tag;
  r.dst = dst;
  r.local = local;
  r.bytes = bytes;
  r.combiner = combiner;
  RequestPtr request = r.request;
  RecvHolders holders = recvHolders();
  auto started = startRecv(r, holders);
  if (!started.isOk()) return failed(started.status());
  if (*started)
    recvs_.push_back(std::move(r));
  else
    waitingRecvs_.emplace(tag.value, std::move(r));
  return request;
}

// Buffers that came back go to the sends that wait, in their order, then to
// the receives that wait, earliest message first; a receive that may not
// wait (see the header) pins one more.
Status StagedConnection::startWaiting(bool& moved) {
  for (auto it = sends_.end() - static_cast<std::ptrdiff_t>(sendsWaiting_); it != sends_.end();
       ++it) {
    BRAID_ASSIGN_OR_RETURN(bool started, startSend(*it));
    if (!started) break;
    it->waiting = false;
    --sendsWaiting_;
    moved = true;
  }
  if (waitingRecvs_.empty()) return Status::ok();
  RecvHolders holders = recvHolders();
  for (auto it = waitingRecvs_.begin(); it != waitingRecvs_.end();) {
    BRAID_ASSIGN_OR_RETURN(bool started, startRecv(it->second, holders));
    if (!started) {
      ++it;
      continue;
    }
    recvs_.push_back(std::move(it->second));
    it = waitingRecvs_.erase(it);
    moved = true;
  }
  return Status::ok();
}

// Each send whose copy has run goes to the host connection, in the order
// posted: a later send waits behind an earlier one still being copied.
Status StagedConnection::postCopiedSends(bool& moved) {
  for (Send& s : sends_) {
    if (s.onHost) continue;
    if (s.waiting) break;
    if (s.copied) {
      BRAID_ASSIGN_OR_RETURN(bool copied, device_->hasRun(*s.copied));
      if (!copied) break;
      giveBack(std::move(s.copied));
    }
    s.onHost = host_.postSend(s.bounce.data(), s.bytes, s.tag);
    s.onHost->watch();
    moved = true;
  }
  return Status::ok();
}

void StagedConnection::finishSends(bool& moved) {
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (!it->onHost || it->onHost->state() == Request::State::kPending) {
      ++it;
      continue;
    }
    if (it->onHost->state() == Request::State::kFailed)
      it->request->fail(it->onHost->error(), it->onHost->failure(), it->onHost->mismatch());
    else
      it->request->complete();
    giveBack(sendPool_, std::move(it->bounce));
    it = sends_.erase(it);
    moved = true;
  }
}

// A receive that arrived queues its copy (or reduction) out of the bounce
// buffer and is done; the buffer is reused once the stream has run it.
Status StagedConnection::finishRecvs(bool& moved) {
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    Recv& r = *it;
    if (r.drained) {
      BRAID_ASSIGN_OR_RETURN(bool drained, device_->hasRun(*r.drained));
      if (!drained) {
        ++it;
        continue;
      }
      giveBack(std::move(r.drained));
      giveBack(recvPool_, std::move(r.bounce));
      it = recvs_.erase(it);
      continue;
    }
    const Request::State state = r.onHost->state();
    if (state == Request::State::kPending) {
      ++it;
      continue;
    }
    moved = true;
    if (state == Request::State::kFailed) {
      r.request->fail(r.onHost->error(), r.onHost->failure(), r.onHost->mismatch());
      giveBack(recvPool_, std::move(r.bounce));
      it = recvs_.erase(it);
      continue;
    }
    if (r.bytes == 0) {
      r.request->complete();
      it = recvs_.erase(it);
      continue;
    }
    BRAID_ASSIGN_OR_RETURN(r.drained, takeEvent());
    Status queued = r.local != nullptr ? device_->enqueueCombine(r.dst, r.local, r.bounce.data(),
                                                                 r.bytes, r.combiner)
                                       : device_->enqueueCopy(r.dst, r.bounce.data(), r.bytes);
    if (queued.isOk()) queued = device_->enqueueRecord(*r.drained);
    if (!queued.isOk()) {
      r.drained.reset();
      retire(recvPool_, std::move(r.bounce));  // a copy of it may be queued
      r.request->fail(queued);
      it = recvs_.erase(it);
      return queued;
    }
    r.request->complete();
    ++it;
  }
  return Status::ok();
}

Result<bool> StagedConnection::progress() {
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) return dead_;
  bool moved = false;
  Status device = postCopiedSends(moved);
  // A host connection that died (the peer left) has failed its pending
  // requests, and those posted later fail too, except receives of messages
  // that arrived before: they still land, and are copied into the GPU here,
  // as the host connection's own users would get them. So its error only
  // passes through; an error of the device ends this connection.
  auto hostMoved = host_.progress();
  if (hostMoved.isOk()) moved = *hostMoved || moved;
  finishSends(moved);
  if (device.isOk()) device = finishRecvs(moved);
  // What waits can start only once something moved or a buffer came back
  // since the last look (here, or in reserve() on another thread); a
  // receive that starts may find its message arrived already.
  if (device.isOk() && (moved || bouncesReturned_ != returnsSeen_)) {
    returnsSeen_ = bouncesReturned_;
    bool started = false;
    device = startWaiting(started);
    if (device.isOk() && started) device = finishRecvs(moved);
    moved = moved || started;
  }
  if (!device.isOk()) {
    failAll(device);
    return dead_;
  }
  if (!hostMoved.isOk()) return hostMoved.status();
  return moved;
}

bool StagedConnection::prepareToSleep() {
  {
    std::lock_guard lock(mutex_);
    // A copy the GPU is running wakes no fd: keep polling until it has run.
    for (const Send& s : sends_)
      if (!s.onHost && s.copied) return false;
    // A post that waits for a bounce buffer waits for the device, maybe.
    if (sendsWaiting_ > 0 || !waitingRecvs_.empty())
      for (const Recv& r : recvs_)
        if (r.drained) return false;
  }
  return host_.prepareToSleep();
}

size_t StagedConnection::bounceBuffers() const {
  std::lock_guard lock(mutex_);
  return bounceBuffers_;
}

void StagedConnection::failAll(const Status& reason, uint64_t callMark) {
  if (dead_.isOk()) dead_ = reason;
  // The host connection's own requests fail with it, so nothing lands in a
  // bounce buffer after this; queued copies may still use the buffers, so
  // they are kept, unused, until the connection goes.
  host_.abortInCall(reason, callMark);
  for (Send& s : sends_) {
    if (s.request->state() == Request::State::kPending) s.request->fail(dead_);
    retire(sendPool_, std::move(s.bounce));
  }
  sends_.clear();
  sendsWaiting_ = 0;
  for (Recv& r : recvs_) {
    if (r.request->state() == Request::State::kPending) r.request->fail(dead_);
    retire(recvPool_, std::move(r.bounce));
  }
  recvs_.clear();
  for (auto& [tag, r] : waitingRecvs_) r.request->fail(dead_);
  waitingRecvs_.clear();
}

void StagedConnection::abortInCall(const Status& reason, uint64_t callMark) {
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) return;
  dead_ = reason.isOk() ? remoteError("gpu_staged: connection closed") : reason;
  failAll(reason, callMark);
}

}  // namespace braid::transport::gpu_staged
