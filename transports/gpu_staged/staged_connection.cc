#include "transports/gpu_staged/staged_connection.h"

#include <algorithm>
#include <utility>

#include "src/common/strcat.h"

namespace braid::transport::gpu_staged {

StagedConnection::StagedConnection(Connection& host, std::shared_ptr<cuda_ipc::IpcDevice> device,
                                   Options options)
    : host_(host), device_(std::move(device)), options_(options) {}

StagedConnection::~StagedConnection() {
  // Queued copies still read or write the bounce buffers: they run first.
  // The host connection is not this one's to close.
  (void)device_->synchronize();
}

Result<StagedConnection::Bounce> StagedConnection::takeBounce(size_t bytes) {
  if (bytes == 0) return Bounce{};
  if (auto it = freeBounces_.lower_bound(bytes); it != freeBounces_.end()) {
    Bounce b = std::move(it->second);
    freeBounces_.erase(it);
    return b;
  }
  const size_t size = std::max(bytes, options_.minBounceBytes);
  BRAID_ASSIGN_OR_RETURN(auto memory, device_->allocateHost(size));
  ++bounceBuffers_;
  return Bounce{std::move(memory), size};
}

void StagedConnection::giveBack(Bounce bounce) {
  if (bounce.memory) freeBounces_.emplace(bounce.bytes, std::move(bounce));
}

Result<std::unique_ptr<cuda_ipc::DeviceEvent>> StagedConnection::takeEvent() {
  if (!freeEvents_.empty()) {
    auto e = std::move(freeEvents_.back());
    freeEvents_.pop_back();
    return e;
  }
  return device_->createEvent();
}

void StagedConnection::giveBack(std::unique_ptr<cuda_ipc::DeviceEvent> event) {
  if (event) freeEvents_.push_back(std::move(event));
}

RequestPtr StagedConnection::failed(Status error) {
  auto request = std::make_shared<Request>();
  request->fail(std::move(error));
  return request;
}

RequestPtr StagedConnection::postSend(const void* data, size_t bytes, Tag tag) {
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) return failed(dead_);
  Send s;
  s.request = std::make_shared<Request>();
  s.bytes = bytes;
  s.tag = tag;
  if (bytes > 0) {
    auto bounce = takeBounce(bytes);
    if (!bounce.isOk()) return failed(bounce.status());
    s.bounce = std::move(*bounce);
    auto event = takeEvent();
    if (!event.isOk()) {
      giveBack(std::move(s.bounce));
      return failed(event.status());
    }
    s.copied = std::move(*event);
    Status queued = device_->enqueueCopy(s.bounce.data(), data, bytes);
    if (queued.isOk()) queued = device_->enqueueRecord(*s.copied);
    if (!queued.isOk()) {
      // The copy may be queued: the bounce buffer is not reused.
      giveBack(std::move(s.copied));
      retired_.push_back(std::move(s.bounce));
      return failed(queued);
    }
  }
  RequestPtr request = s.request;
  sends_.push_back(std::move(s));
  return request;
}

RequestPtr StagedConnection::postRecv(void* data, size_t bytes, Tag tag) {
  return postRecvReduce(data, nullptr, bytes, tag, Combiner{});
}

RequestPtr StagedConnection::postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                                            const Combiner& combiner) {
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) return failed(dead_);
  Recv r;
  r.request = std::make_shared<Request>();
  r.dst = dst;
  r.local = local;
  r.bytes = bytes;
  r.combiner = combiner;
  auto bounce = takeBounce(bytes);
  if (!bounce.isOk()) return failed(bounce.status());
  r.bounce = std::move(*bounce);
  r.onHost = host_.postRecv(r.bounce.data(), bytes, tag);
  RequestPtr request = r.request;
  recvs_.push_back(std::move(r));
  return request;
}

// Each send whose copy has run goes to the host connection, in the order
// posted: a later send waits behind an earlier one still being copied.
Status StagedConnection::postCopiedSends(bool& moved) {
  for (Send& s : sends_) {
    if (s.onHost) continue;
    if (s.copied) {
      BRAID_ASSIGN_OR_RETURN(bool copied, device_->hasRun(*s.copied));
      if (!copied) break;
      giveBack(std::move(s.copied));
    }
    s.onHost = host_.postSend(s.bounce.data(), s.bytes, s.tag);
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
    giveBack(std::move(it->bounce));
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
      giveBack(std::move(r.bounce));
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
      giveBack(std::move(r.bounce));
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
      retired_.push_back(std::move(r.bounce));  // a copy of it may be queued
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
  }
  return host_.prepareToSleep();
}

size_t StagedConnection::bounceBuffers() const {
  std::lock_guard lock(mutex_);
  return bounceBuffers_;
}

void StagedConnection::failAll(const Status& reason) {
  if (dead_.isOk()) dead_ = reason;
  // The host connection's own requests fail with it, so nothing lands in a
  // bounce buffer after this; queued copies may still use the buffers, so
  // they are kept, unused, until the connection goes.
  host_.abort(reason);
  for (Send& s : sends_) {
    if (s.request->state() == Request::State::kPending) s.request->fail(dead_);
    retired_.push_back(std::move(s.bounce));
  }
  sends_.clear();
  for (Recv& r : recvs_) {
    if (r.request->state() == Request::State::kPending) r.request->fail(dead_);
    retired_.push_back(std::move(r.bounce));
  }
  recvs_.clear();
}

void StagedConnection::abort(const Status& reason) {
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) return;
  dead_ = reason.isOk() ? remoteError("gpu_staged: connection closed") : reason;
  failAll(reason);
}

}  // namespace braid::transport::gpu_staged
