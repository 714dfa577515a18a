// A ByteStream through shared memory: two single-producer single-consumer
// rings in one Segment, one per direction. Bytes move with a memcpy into
// the ring and one out of it, and no system call while both ends are busy.
//
// Sleeping: an end that is about to block in poll(2) raises a flag in the
// ring it waits on; the other end, after moving bytes, sees the flag and
// rings a doorbell, one byte on the socket the two ranks share. The socket
// also tells of a peer that died: its end of the socket closes with it.
//
// Single copy: where the two processes may read each other's memory
// (process_vm_readv, "cross-memory attach"), readPeer() copies a large
// payload from the sender's buffer straight into the receiver's, and the
// rings carry only a small descriptor of it. Whether they may is probed once
// per pair at setup (negotiateReadPeer): ptrace rules (Yama, containers) can
// forbid it, and the pair then keeps to the rings. writePeer() is the same
// copy the other way (process_vm_writev), under the same permission: the
// sender of a descriptor writes part of the payload into its receiver.
// A payload in memory of braidHostAlloc is read through a mapping of the
// sender's allocation instead, with memcpy (host_allocations.h).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "src/common/deadline.h"
#include "transports/byte_stream.h"
#include "transports/shm/host_allocations.h"
#include "transports/shm/shm_segment.h"
#include "transports/tcp/socket.h"

namespace braid::shm {

struct alignas(64) RingControl {
  alignas(64) std::atomic<uint64_t> head;  // bytes ever written; the producer's
  alignas(64) std::atomic<uint64_t> tail;  // bytes ever read; the consumer's
  alignas(64) std::atomic<uint32_t> consumerSleeping;
  alignas(64) std::atomic<uint32_t> producerSleeping;
  alignas(64) std::atomic<uint32_t> closed;  // the producer wrote its last byte
  // The producer is writing into the consumer's memory (writePeer): raised
  // before it reads whether the consumer closed, lowered after the write.
  // The consumer's close() waits for it to fall.
  alignas(64) std::atomic<uint32_t> writingIntoConsumer;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "rings shared between processes need lock-free atomics");

// Bytes of a segment holding two rings of `ringBytes` each.
size_t segmentBytes(size_t ringBytes);

// The sizes a ring may have (powers of two; BRAID_SHM_BYTES).
inline constexpr size_t kMinRingBytes = 4096;
inline constexpr size_t kMaxRingBytes = size_t{1} << 40;

// The ring size for the pairs of `ranksOnHost` ranks when /dev/shm has
// `freeBytes` free: `preferred`, or the largest power of two below it
// (kMinRingBytes at least) whose segments, one per pair, take at most half
// of that room. The other half is left to the rest of the host's users of
// /dev/shm (data loaders, other jobs, CUDA).
size_t fittedRingBytes(size_t preferred, size_t freeBytes, int ranksOnHost);

class ShmStream final : public transport::ByteStream {
 public:
  // The creator of the segment writes ring 0 and reads ring 1; the other
  // end the reverse. `doorbell` is the connected socket to the peer.
  // `ringBytes` must be a power of two.
  ShmStream(Segment segment, size_t ringBytes, bool creator, tcp::Fd doorbell, int peer);
  // Lays out fresh rings in a segment just created (before the peer maps it).
  static void initialize(Segment& segment, size_t ringBytes);

  Result<size_t> writeSome(const iovec* iov, int count) override;
  Result<size_t> readSome(void* into, size_t room) override;
  void writeLast(const iovec* iov, int count) override;
  void close() override;
  int pollFd() const override { return doorbell_.get(); }
  bool pollForWrite(bool) const override { return false; }
  bool prepareToSleep(bool sendsPending) override;
  bool mayHaveInput() const override {
    return in_.control->head.load(std::memory_order_acquire) !=
           in_.control->tail.load(std::memory_order_relaxed);
  }

  // From now on readPeer() reads process `peerPid`, which both ends proved
  // they may read (negotiateReadPeer).
  void enableReadPeer(pid_t peerPid) {
    peerPid_ = peerPid;
    peerAllocations_.setPeer(peerPid, peer_);
  }
  bool canReadPeer() const override { return peerPid_ > 0; }
  std::optional<uint64_t> peerReadKey(const void* data, size_t bytes) override;
  Status readPeer(void* into, uint64_t address, uint64_t key, size_t bytes) override;
  Result<const std::byte*> peerBytesInPlace(uint64_t address, uint64_t key, size_t bytes) override;
  bool canWritePeer() const override { return peerPid_ > 0; }
  // A payload in a shared allocation is read at memcpy's speed, about twice
  // what process_vm_writev writes; into a shared allocation the sender
  // writes at memcpy's speed too (docs/PERFORMANCE.md).
  bool pushSpeedsUp(uint64_t sourceKey, uint64_t targetKey) const override {
    return !isSharedKey(sourceKey) || isSharedKey(targetKey);
  }
  Status writePeer(uint64_t address, uint64_t key, const void* from, size_t bytes) override;

 private:
  struct Ring {
    RingControl* control;
    uint8_t* data;
  };
  size_t copyIn(const iovec* iov, int count, size_t limit);
  void ring(std::atomic<uint32_t>& sleeping);
  Status drainDoorbell();
  Status closedByPeer() const;

  Segment segment_;
  const size_t ringBytes_;
  Ring out_, in_;
  tcp::Fd doorbell_;
  const int peer_;
  pid_t peerPid_ = 0;                       // 0: readPeer() is not allowed
  PeerAllocations peerAllocations_;         // the peer's braidHostAlloc memory, mapped here
  uint64_t outHead_ = 0, outTailSeen_ = 0;  // the producer's own view
  uint64_t inTail_ = 0;                     // the consumer's own view
  bool slept_ = false;                      // a doorbell may be waiting
  bool peerGone_ = false;                   // the doorbell socket closed
  bool closed_ = false;
};

struct ReadPeerVerdict {
  pid_t peerPid = 0;    // the peer's process when both ends may read each other, else 0
  std::string refused;  // why not, for the log
};

// Run by both ends of a pair over their connected socket, before it becomes
// the doorbell: each sends its pid and the address and value of a random
// word of its memory, reads the peer's word, and tells the peer whether it
// could. Reading a random value proves the pid names the peer (not some
// process of another pid namespace). `willing` false refuses outright.
// Both ends reach the same verdict; an error means the socket failed.
Result<ReadPeerVerdict> negotiateReadPeer(int fd, bool willing, Deadline deadline);

}  // namespace braid::shm
