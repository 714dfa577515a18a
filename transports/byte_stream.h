// An ordered, reliable, nonblocking byte stream between two ranks: a TCP
// socket, or a pair of rings in shared memory. StreamConnection frames tagged
// messages over one; a stream knows nothing of frames or tags.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "src/common/status.h"

namespace braid::transport {

class ByteStream {
 public:
  virtual ~ByteStream() = default;

  // Takes what fits now from `iov` and returns how many bytes; 0 when there
  // is no room. An error means the stream is dead.
  virtual Result<size_t> writeSome(const iovec* iov, int count) = 0;
  // Reads up to `room` bytes into `into`; 0 when nothing has arrived. The
  // peer's end of stream is an error, after every byte it wrote was read.
  virtual Result<size_t> readSome(void* into, size_t room) = 0;
  // The last bytes before close(), written only if they fit whole now.
  virtual void writeLast(const iovec* iov, int count) = 0;
  // Ends the stream in both directions; the peer reads to the end, then fails.
  virtual void close() = 0;

  // The fd to poll(2) when the stream is idle, and whether to wait for
  // POLLOUT on it while bytes are waiting to be written.
  virtual int pollFd() const = 0;
  virtual bool pollForWrite(bool sendsPending) const = 0;
  // Called just before the caller sleeps on pollFd(). Returns false when the
  // stream can move bytes already, so the caller must not sleep.
  virtual bool prepareToSleep(bool sendsPending) {
    (void)sendsPending;
    return true;
  }

  // False only when surely no byte waits to be read (any thread, cheap).
  virtual bool mayHaveInput() const { return true; }

  // Whether readPeer() works: the peer is a process of this host whose
  // memory this one may read, which lets a large message cross in one copy
  // instead of two (into the stream, out of it).
  virtual bool canReadPeer() const { return false; }
  // The key under which the peer may read [data, data + bytes) with
  // readPeer(), or nothing when it cannot: the bytes then go through the
  // stream. Shared memory needs no key (0); RDMA reads only buffers the user
  // declared (MemoryRegistry), under their registration's key.
  virtual std::optional<uint64_t> peerReadKey(const void* data, size_t bytes) {
    (void)data, (void)bytes;
    return canReadPeer() ? std::optional<uint64_t>(0) : std::nullopt;
  }
  // Copies `bytes` at `address` in the peer's memory, under the key its
  // peerReadKey() gave, into `into`: all of them, or an error.
  virtual Status readPeer(void* into, uint64_t address, uint64_t key, size_t bytes) {
    (void)into, (void)address, (void)key, (void)bytes;
    return notSupported("this stream cannot read the peer's memory");
  }

  // Where the peer's [address, address + bytes) under `key` can be read in
  // place, valid until the next call into this stream, or nullptr when it
  // cannot (readPeer() copies it then). A receiver that reduces the payload
  // reads it from there instead of copying it first.
  virtual Result<const std::byte*> peerBytesInPlace(uint64_t address, uint64_t key, size_t bytes) {
    (void)address, (void)key, (void)bytes;
    return static_cast<const std::byte*>(nullptr);
  }

  // Whether writePeer() works: the peer may write into this process's
  // memory and this one into the peer's (the same permission both ways, as
  // process_vm_writev needs what process_vm_readv does). A receiver then
  // asks the sender of a large descriptor to copy part of it itself, so
  // that both ends copy at once.
  virtual bool canWritePeer() const { return false; }
  // Whether asking the sender of a payload readable under `sourceKey` to
  // write part of it into this end's buffer, reachable under `targetKey`
  // (peerReadKey of the receive buffer), makes the payload arrive sooner
  // than reading all of it. Not when the receiver reads at memory speed (a
  // mapping) and the sender would write at the speed of a system call.
  virtual bool pushSpeedsUp(uint64_t sourceKey, uint64_t targetKey) const {
    (void)sourceKey, (void)targetKey;
    return true;
  }
  // Copies `bytes` from `from` to `address` in the peer's memory, under the
  // key its peerReadKey() gave for that memory: all of them, or an error.
  virtual Status writePeer(uint64_t address, uint64_t key, const void* from, size_t bytes) {
    (void)address, (void)key, (void)from, (void)bytes;
    return notSupported("this stream cannot write the peer's memory");
  }
};

}  // namespace braid::transport
