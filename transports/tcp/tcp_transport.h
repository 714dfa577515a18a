// The TCP transport: one listening socket per rank and one authenticated,
// nonblocking, TCP_NODELAY connection per pair of ranks, opened once at
// communicator init and reused by every call.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "src/common/secret.h"
#include "transports/tcp/socket.h"

namespace braid::tcp {

class TcpTransport {
 public:
  // Listens on `bindAddress` (its port is ignored: the kernel picks one).
  static Result<std::unique_ptr<TcpTransport>> create(const SocketAddress& bindAddress,
                                                      const Secret& secret);

  std::string_view name() const { return "tcp"; }
  // What peers connect to: published through the bootstrap.
  std::string localAddress() const { return address_.toString(); }

  // Connects this rank to every rank in `peers` (addresses indexed by rank):
  // it dials lower ranks and accepts higher ones, concurrently. The sockets
  // are authenticated and nonblocking; the caller wraps each in a stream.
  Result<std::map<int, Fd>> connectPeers(int rank, std::span<const int> peers,
                                         const std::vector<std::string>& addresses,
                                         Deadline deadline);

 private:
  // The connections of `higher`, each authenticated, strangers refused.
  Result<std::map<int, Fd>> acceptHigherRanks(const std::set<int>& higher, Deadline deadline);

  TcpTransport(Fd listener, SocketAddress address, const Secret& secret)
      : listener_(std::move(listener)), address_(address), secret_(secret) {}

  Fd listener_;
  SocketAddress address_;
  Secret secret_;
};

}  // namespace braid::tcp
