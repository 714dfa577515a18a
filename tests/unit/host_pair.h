// Two ends of a host connection over a Unix socket pair, in this process:
// for tests of the transports that run on top of one (cuda_ipc records,
// gpu_staged messages).
#pragma once

#include <sys/socket.h>

#include <memory>
#include <utility>

#include "transports/stream_connection.h"
#include "transports/tcp/socket_stream.h"

namespace braid::transport::testing {

// Rank 0's end and rank 1's; both null if no socket pair could be made.
inline std::pair<std::unique_ptr<Connection>, std::unique_ptr<Connection>> hostPair() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) return {};
  auto end = [](int fd, int peer) -> std::unique_ptr<Connection> {
    return std::make_unique<StreamConnection>(
        std::make_unique<tcp::SocketStream>(tcp::Fd(fd), peer), peer);
  };
  return {end(fds[0], 1), end(fds[1], 0)};
}

}  // namespace braid::transport::testing
