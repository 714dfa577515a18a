// A ByteStream over one reliable-connected queue pair, so that the framing,
// matching and failure reports of StreamConnection carry over RDMA as they
// do over TCP and shared memory.
//
// Each end owns a receive ring in registered memory; its peer writes into
// it with RDMA write with immediate, the immediate telling how many bytes
// landed. A sender stages bytes at the same offset of a local registered
// ring that they take in the remote one, so every write is one contiguous
// piece (split where the ring wraps, and at `maxWriteBytes`).
//
// Flow control is by credits, returned as zero-byte writes with immediate:
// the receiver counts the messages it has read to the end and hands the
// count back, in batches, and at once when it has read everything that
// arrived. A credit frees the ring space of the oldest messages in flight
// and their receive work requests, so a sender never writes past the
// space the receiver has read, nor more messages than it keeps receives
// posted for: no receiver-not-ready wait in the normal course.
//
// Immediate values: bit 31 set = credits (bits 0..30: messages); bit 30 set
// = the end of the stream; else the byte count of a data write.
//
// Large messages from buffers the user declared (braidCommRegister) skip the
// rings: the sender's StreamConnection sends a descriptor with the key of
// the buffer's registration (peerReadKey), and the receiver copies the
// payload with RDMA reads (readPeer) straight into its receive buffer when
// that is declared too, else through a registered bounce buffer. The
// registrations are made on first use and kept until the buffer is
// deregistered (RegistrationCache).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transports/byte_stream.h"
#include "transports/ib/registration_cache.h"
#include "transports/ib/verbs.h"
#include "transports/memory_registry.h"
#include "transports/tcp/socket.h"

namespace braid::ib {

struct RdmaStreamOptions {
  size_t ringBytes = 1 << 20;        // each direction; a power of two
  uint32_t maxWriteBytes = 1 << 16;  // the largest single RDMA write
  uint32_t window = 64;              // data writes in flight, at most
  uint8_t port = 1;
  int gidIndex = 0;        // RoCE: the local GID the path is sent from
  uint8_t timeout = 14;    // BRAID_IB_TIMEOUT: 4.096 us * 2^timeout per attempt
  uint8_t retryCount = 7;  // BRAID_IB_RETRY_CNT
  // Buffers the peer may read straight from this end's memory; null: none.
  std::shared_ptr<const transport::MemoryRegistry> registry;
  size_t bounceBytes = 1 << 18;  // reads into undeclared memory land here first
};

// What one end tells the other to connect: its queue pair's address and
// where its receive ring is. Fixed layout on the wire (little endian).
struct RdmaStreamCard {
  QueuePairAddress address;
  uint64_t ringAddr = 0;
  uint32_t ringRkey = 0;
  uint64_t ringBytes = 0;
  uint32_t window = 0;
  Mtu mtu = Mtu::k1024;  // the sender's port's active MTU; the path takes the smaller

  static constexpr size_t kWireBytes = 4 + 4 + 4 + 2 + 16 + 4 + 8 + 4 + 8 + 4 + 1;  // magic first
  std::vector<uint8_t> encode() const;
  static Result<RdmaStreamCard> decode(const std::vector<uint8_t>& bytes);
};

// A completion error as braid reports it: the status spelled out, a hint,
// and the code (kRemoteError where the peer or the path is the cause).
Status completionError(const Completion& completion, int peer, const char* what);

class RdmaStream final : public transport::ByteStream {
 public:
  // Both ends call it, each with its end of `wire` (the pair's bootstrap
  // socket): sets up the queue pair and rings on `device`, swaps cards,
  // and brings the queue pair to RTS.
  static Result<std::unique_ptr<RdmaStream>> connect(Device& device, tcp::Wire& wire,
                                                     const RdmaStreamOptions& options, int peer);
  ~RdmaStream() override;

  Result<size_t> writeSome(const iovec* iov, int count) override;
  Result<size_t> readSome(void* into, size_t room) override;
  void writeLast(const iovec* iov, int count) override;
  void close() override;
  // From now on the pair's bootstrap socket tells of a peer that died: its
  // end closes with its process, as for shared memory. Bytes that arrived
  // before are still read.
  Status watchPeerSocket(tcp::Fd socket);

  // The completion queue's wake-up fd (data, credits and errors all
  // complete on the one queue), joined with the peer's socket once watched.
  int pollFd() const override { return epoll_.get() >= 0 ? epoll_.get() : cq_->wakeFd(); }
  bool pollForWrite(bool) const override { return false; }
  bool prepareToSleep(bool sendsPending) override;

  // The peer reads declared buffers (options.registry); any receiver can
  // read, into declared memory directly or through the bounce buffer.
  bool canReadPeer() const override { return cache_ != nullptr; }
  std::optional<uint64_t> peerReadKey(const void* data, size_t bytes) override;
  Status readPeer(void* into, uint64_t address, uint64_t key, size_t bytes) override;
  // For tests: registrations made of declared buffers, RDMA reads posted.
  const RegistrationCache* registrations() const { return cache_.get(); }
  uint64_t readsPosted() const { return readsPosted_; }

  // For tests: data writes in flight and the ring bytes they hold.
  size_t writesInFlight() const { return inFlight_.size(); }
  uint64_t bytesInFlight() const { return head_ - creditedTail_; }

 private:
  RdmaStream(const RdmaStreamOptions& options, int peer);
  // Polls both completion queues: send errors, arrived data, credits.
  Status pump();
  // Writes [head_, head_ + bytes) of the staging ring; the caller made room.
  Status postData(uint64_t bytes);
  // A zero-byte write with immediate; false when no send slot is free now.
  Result<bool> postControl(uint32_t imm);
  // True once the watched socket shows the peer's end closed.
  bool peerSocketClosed();
  Status returnCredits(bool force);

  const RdmaStreamOptions options_;
  const int peer_;
  std::unique_ptr<ProtectionDomain> pd_;
  std::unique_ptr<CompletionQueue> cq_;  // sends and receives both
  uint64_t completions_ = 0;             // polled so far
  std::unique_ptr<QueuePair> qp_;
  std::vector<uint8_t> recvRing_, sendRing_;
  std::unique_ptr<MemoryRegion> recvMr_, sendMr_;
  std::unique_ptr<RegistrationCache> cache_;
  std::vector<uint8_t> bounce_;  // allocated on the first read that needs it
  std::unique_ptr<MemoryRegion> bounceMr_;
  uint64_t readsPosted_ = 0, readsDone_ = 0, bytesRead_ = 0;
  bool warnedUnregistrable_ = false;
  RemoteBuffer peerRing_;
  uint32_t peerWindow_ = 0;

  // Sending.
  uint64_t head_ = 0;              // bytes ever staged and written
  uint64_t creditedTail_ = 0;      // bytes the peer has read
  std::deque<uint32_t> inFlight_;  // sizes of data writes not yet credited
  uint64_t nextWrId_ = 1;
  uint32_t sendsOutstanding_ = 0;  // posted, completion not yet polled
  uint32_t maxSends_ = 0;
  // Receiving.
  uint64_t arrived_ = 0;               // bytes ever landed in recvRing_
  uint64_t tail_ = 0;                  // bytes ever read out
  std::deque<uint32_t> arrivedSizes_;  // data writes not wholly read
  uint64_t readOfFront_ = 0;           // bytes read of arrivedSizes_.front()
  uint32_t creditsOwed_ = 0;           // messages read, not yet credited
  bool peerClosed_ = false;
  tcp::Fd socket_, epoll_;
  bool closed_ = false;
  Status dead_;
};

}  // namespace braid::ib
