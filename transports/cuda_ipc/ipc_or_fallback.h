// A connection to a peer of the same host for GPU memory: over cuda_ipc when
// the two ends mapped each other's memory, else over `fallback`, another
// connection to the same peer that moves GPU memory some other way (through
// pinned host memory). GPUs without peer access between them, or processes
// the driver will not let share memory, make cuda_ipc decline; both ends
// learn it from the same handshake, so both pick the fallback.
//
// Until the handshake has decided, posts are queued here, and forwarded in
// their order once it has; their requests follow those of the connection
// that took them. After that, posts go straight through.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "transports/cuda_ipc/cuda_ipc_connection.h"
#include "transports/transport.h"

namespace braid::transport::cuda_ipc {

class IpcOrFallback final : public Connection {
 public:
  // `fallback` must outlive this.
  IpcOrFallback(std::unique_ptr<CudaIpcConnection> ipc, Connection& fallback);

  RequestPtr postSend(const void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecv(void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                            const Combiner& combiner) override;
  Result<bool> progress() override;
  int pollFd() const override { return current().pollFd(); }
  bool wantsWrite() const override { return current().wantsWrite(); }
  bool prepareToSleep() override;
  std::chrono::microseconds sleepAtMost() const override { return current().sleepAtMost(); }
  void abort(const Status& reason) override;
  void abortInCall(const Status& reason, uint64_t callMark) override;
  Status peerFailure() const override { return current().peerFailure(); }
  bool ended() const override { return current().ended(); }
  uint64_t peerFailedCall() const override { return current().peerFailedCall(); }
  void forgetArrivalsBefore(uint64_t tag) override;
  std::optional<Tag> unclaimed(uint8_t channel, uint64_t below) override {
    return current().unclaimed(channel, below);
  }
  bool mayHaveUnclaimed() const override { return current().mayHaveUnclaimed(); }
  int peer() const override { return ipc_->peer(); }
  // On the connection chosen; nothing while undecided, since the fallback's
  // pinned memory (for whole messages here) would be kept for a pair that
  // most likely maps. A pair that falls back mid-call pins it then.
  Status reserve(std::span<const size_t> sends, std::span<const size_t> recvs) override;

  // Whether the messages go over the fallback (false while undecided).
  bool fellBack() const;
  // Whether the pair has decided: mapped, fallen back, or broken first.
  bool decided() const { return chosen_.load(std::memory_order_acquire) != nullptr; }

 private:
  struct Queued {
    bool isSend;
    const void* source;  // a send's data, or a receive's local operand
    void* destination;   // a receive's
    size_t bytes;
    Tag tag;
    Combiner combiner;
    RequestPtr request;
  };

  Connection& current() const;
  // Posts `post` on `to`, as it was posted here.
  static RequestPtr forward(Connection& to, const Queued& post);
  RequestPtr queue(Queued post);
  // Under mutex_: hands the queued posts to `chosen`, then makes it current.
  void choose(Connection& chosen);
  // Under mutex_: completes or fails forwarded posts whose own request did.
  bool mirrorFinished();

  std::unique_ptr<CudaIpcConnection> ipc_;
  Connection& fallback_;
  mutable std::mutex mutex_;
  std::atomic<Connection*> chosen_{nullptr};
  std::vector<Queued> queued_;
  // Posts forwarded from the queue: the request handed out, and the one of
  // the connection that took it.
  std::vector<std::pair<RequestPtr, RequestPtr>> forwarded_;
  std::atomic<bool> anyForwarded_{false};
};

}  // namespace braid::transport::cuda_ipc
