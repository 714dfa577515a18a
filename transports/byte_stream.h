// An ordered, reliable, nonblocking byte stream between two ranks: a TCP
// socket, or a pair of rings in shared memory. StreamConnection frames tagged
// messages over one; a stream knows nothing of frames or tags.
#pragma once

#include <sys/uio.h>

#include <cstddef>

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
};

}  // namespace braid::transport
