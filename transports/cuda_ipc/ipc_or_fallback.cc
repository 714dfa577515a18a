#include "transports/cuda_ipc/ipc_or_fallback.h"

#include "src/common/log.h"

namespace braid::transport::cuda_ipc {
namespace {

void settle(Request& mine, const Request& theirs) {
  if (theirs.state() == Request::State::kDone)
    mine.complete();
  else
    mine.fail(theirs.error(), theirs.failure(), theirs.mismatch());
}

}  // namespace

IpcOrFallback::IpcOrFallback(std::unique_ptr<CudaIpcConnection> ipc, Connection& fallback)
    : ipc_(std::move(ipc)), fallback_(fallback) {}

Connection& IpcOrFallback::current() const {
  Connection* chosen = chosen_.load(std::memory_order_acquire);
  return chosen != nullptr ? *chosen : *ipc_;
}

bool IpcOrFallback::fellBack() const {
  return chosen_.load(std::memory_order_acquire) == &fallback_;
}

RequestPtr IpcOrFallback::forward(Connection& to, const Queued& post) {
  if (post.isSend) return to.postSend(post.source, post.bytes, post.tag);
  if (post.combiner.apply != nullptr || post.combiner.applyOnDevice != nullptr)
    return to.postRecvReduce(post.destination, post.source, post.bytes, post.tag, post.combiner);
  return to.postRecv(post.destination, post.bytes, post.tag);
}

RequestPtr IpcOrFallback::postSend(const void* data, size_t bytes, Tag tag) {
  if (Connection* chosen = chosen_.load(std::memory_order_acquire))
    return chosen->postSend(data, bytes, tag);
  return queue(Queued{true, data, nullptr, bytes, tag, Combiner{}, nullptr});
}

RequestPtr IpcOrFallback::postRecv(void* data, size_t bytes, Tag tag) {
  if (Connection* chosen = chosen_.load(std::memory_order_acquire))
    return chosen->postRecv(data, bytes, tag);
  return queue(Queued{false, nullptr, data, bytes, tag, Combiner{}, nullptr});
}

RequestPtr IpcOrFallback::postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                                         const Combiner& combiner) {
  if (Connection* chosen = chosen_.load(std::memory_order_acquire))
    return chosen->postRecvReduce(dst, local, bytes, tag, combiner);
  return queue(Queued{false, local, dst, bytes, tag, combiner, nullptr});
}

RequestPtr IpcOrFallback::queue(Queued post) {
  std::unique_lock lock(mutex_);
  if (Connection* chosen = chosen_.load(std::memory_order_acquire)) {
    lock.unlock();  // decided meanwhile
    return forward(*chosen, post);
  }
  post.request = std::make_shared<Request>();
  RequestPtr request = post.request;
  queued_.push_back(std::move(post));
  return request;
}

void IpcOrFallback::choose(Connection& chosen) {
  for (Queued& q : queued_) {
    // Another thread may complete it on the shared connection while the
    // caller sleeps on this one: watched, it wakes the caller.
    RequestPtr theirs = forward(chosen, q);
    theirs->watch();
    forwarded_.emplace_back(q.request, std::move(theirs));
  }
  queued_.clear();
  anyForwarded_.store(!forwarded_.empty(), std::memory_order_release);
  chosen_.store(&chosen, std::memory_order_release);
}

bool IpcOrFallback::mirrorFinished() {
  bool any = false;
  for (auto it = forwarded_.begin(); it != forwarded_.end();) {
    if (it->second->state() == Request::State::kPending) {
      ++it;
      continue;
    }
    settle(*it->first, *it->second);
    it = forwarded_.erase(it);
    any = true;
  }
  anyForwarded_.store(!forwarded_.empty(), std::memory_order_release);
  return any;
}

Result<bool> IpcOrFallback::progress() {
  Connection* chosen = chosen_.load(std::memory_order_acquire);
  if (chosen == nullptr) {
    std::lock_guard lock(mutex_);
    chosen = chosen_.load(std::memory_order_acquire);
    if (chosen == nullptr) {
      Result<bool> moved = ipc_->progress();
      switch (ipc_->mapping()) {
        case CudaIpcConnection::Mapping::kPending:
          if (!moved.isOk()) {
            // Broken before it decided: what waits fails as the connection did.
            for (Queued& q : queued_) q.request->fail(moved.status());
            queued_.clear();
            chosen_.store(ipc_.get(), std::memory_order_release);
          }
          return moved;
        case CudaIpcConnection::Mapping::kMapped:
          choose(*ipc_);
          break;
        case CudaIpcConnection::Mapping::kDeclined: {
          // Once a warning per process: on a host whose GPUs have no peer
          // access every pair says the same, and the rest go to INFO.
          static std::atomic<bool> warned{false};
          if (!warned.exchange(true))
            BRAID_WARN(ipc_->declinedBecause().message(), "; GPU memory to and from rank ", peer(),
                       " goes through pinned host memory instead (BRAID_CUDA_IPC=0 does so for "
                       "every peer; BRAID_DEBUG=INFO names every pair that does)");
          else
            BRAID_INFO(ipc_->declinedBecause().message(), "; GPU memory to and from rank ", peer(),
                       " goes through pinned host memory instead");
          choose(fallback_);
          break;
        }
      }
      chosen = chosen_.load(std::memory_order_acquire);
    }
  }
  Result<bool> moved = chosen->progress();
  bool mirrored = false;
  if (anyForwarded_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mutex_);
    mirrored = mirrorFinished();
  }
  if (!moved.isOk()) return moved;
  return *moved || mirrored;
}

void IpcOrFallback::abort(const Status& reason) {
  abortInCall(reason, 0);
}

Status IpcOrFallback::reserve(std::span<const size_t> sends, std::span<const size_t> recvs) {
  Connection* chosen = chosen_.load(std::memory_order_acquire);
  return chosen != nullptr ? chosen->reserve(sends, recvs) : Status::ok();
}

bool IpcOrFallback::prepareToSleep() {
  // The fallback may be progressed by others too (Send/Recv share it), who
  // complete a forwarded post's own request without waking this caller.
  if (anyForwarded_.load(std::memory_order_acquire)) {
    std::lock_guard lock(mutex_);
    for (const auto& [mine, theirs] : forwarded_)
      if (theirs->state() != Request::State::kPending) return false;
  }
  return current().prepareToSleep();
}

namespace {

void abortWith(Connection& connection, const Status& reason, uint64_t callMark) {
  if (callMark == 0)
    connection.abort(reason);
  else
    connection.abortInCall(reason, callMark);
}

}  // namespace

void IpcOrFallback::forgetArrivalsBefore(uint64_t tag) {
  ipc_->forgetArrivalsBefore(tag);
  fallback_.forgetArrivalsBefore(tag);
}

void IpcOrFallback::abortInCall(const Status& reason, uint64_t callMark) {
  Connection* chosen = nullptr;
  {
    std::lock_guard lock(mutex_);
    chosen = chosen_.load(std::memory_order_acquire);
    if (chosen == nullptr) {
      // Aborted before it is made current, so that no progress() of another
      // thread can decide in between and leave the abort unsaid.
      abortWith(*ipc_, reason, callMark);
      const Status why = reason.isOk() ? remoteError("cuda_ipc: connection closed") : reason;
      for (Queued& q : queued_) q.request->fail(why);
      queued_.clear();
      chosen_.store(ipc_.get(), std::memory_order_release);
      return;
    }
  }
  abortWith(*chosen, reason, callMark);
  std::lock_guard lock(mutex_);
  (void)mirrorFinished();  // the forwarded posts failed with it
}

}  // namespace braid::transport::cuda_ipc
