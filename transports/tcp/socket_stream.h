// A ByteStream over a connected nonblocking TCP (or Unix) socket.
#pragma once

#include "transports/byte_stream.h"
#include "transports/tcp/socket.h"

namespace braid::tcp {

class SocketStream final : public transport::ByteStream {
 public:
  SocketStream(Fd fd, int peer) : fd_(std::move(fd)), peer_(peer) {}

  Result<size_t> writeSome(const iovec* iov, int count) override;
  Result<size_t> readSome(void* into, size_t room) override;
  void writeLast(const iovec* iov, int count) override;
  void close() override;
  int pollFd() const override { return fd_.get(); }
  bool pollForWrite(bool sendsPending) const override { return sendsPending; }

 private:
  Status closedByPeer() const;

  Fd fd_;
  const int peer_;
};

}  // namespace braid::tcp
