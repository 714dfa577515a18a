// The connection of a rank to itself (Send/Recv to one's own rank inside a
// group): a send is matched to the receive with the same tag by a memcpy.
#pragma once

#include <map>
#include <mutex>
#include <vector>

#include "transports/transport.h"

namespace braid::transport {

class LoopbackConnection final : public Connection {
 public:
  explicit LoopbackConnection(int rank) : rank_(rank) {}

  RequestPtr postSend(const void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecv(void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                            const Combiner& combiner) override;
  Result<bool> progress() override { return false; }
  int pollFd() const override { return -1; }
  bool wantsWrite() const override { return false; }
  void abort(const Status& reason) override;
  int peer() const override { return rank_; }
  Status peerFailure() const override { return Status::ok(); }
  bool ended() const override { return false; }
  std::optional<Tag> unclaimed(uint8_t, uint64_t) override { return std::nullopt; }
  bool mayHaveUnclaimed() const override { return false; }

 private:
  struct Side {
    void* data;
    size_t bytes;
    uint64_t check;
    RequestPtr request;
    const void* local = nullptr;  // receives with reduction
    Combiner combiner;
  };
  void match(Side& send, Side& recv);

  const int rank_;
  std::mutex mutex_;
  std::map<uint64_t, Side> sends_, recvs_;
};

}  // namespace braid::transport
