// Rendezvous: how ranks that share a unique id (or launcher variables) find
// each other. Rank 0's side runs a small server that collects every rank's
// data-plane address and hands back the full table once all have joined.
// Every connection is authenticated with the id's secret.
#pragma once

#include <string>
#include <vector>

#include "src/common/deadline.h"
#include "src/common/secret.h"
#include "src/common/status.h"
#include "transports/tcp/socket.h"

namespace braid {

inline constexpr size_t kUniqueIdBytes = 128;

struct RendezvousInfo {
  tcp::SocketAddress root;  // where the rendezvous server listens
  Secret secret{};

  void encode(char out[kUniqueIdBytes]) const;
  static Result<RendezvousInfo> decode(const char in[kUniqueIdBytes]);
};

// The address to publish for rank 0: BRAID_SOCKET_IFNAME's address if set,
// else the first non-loopback interface that accepts a connection to
// itself, else loopback. Returns the address with port 0.
Result<tcp::SocketAddress> chooseBootstrapAddress(const std::string& ifname, Deadline deadline);

// Starts the rendezvous server on `listenAt` (port 0 = any) on a detached
// thread that exits once every rank joined or the timeout passed. Returns
// the address it listens on.
Result<tcp::SocketAddress> startRendezvousServer(const tcp::SocketAddress& listenAt,
                                                 const Secret& secret, double timeoutSeconds);

// One rank's side: connects to the server, and returns the local address
// used to reach it (the interface to publish) through `localAddress`.
class RendezvousClient {
 public:
  static Result<RendezvousClient> connect(const RendezvousInfo& info, int rank, Deadline deadline);
  const tcp::SocketAddress& localAddress() const { return local_; }
  // Sends this rank's data address; returns every rank's, indexed by rank.
  Result<std::vector<std::string>> exchange(int nranks, const std::string& myAddress,
                                            Deadline deadline);

 private:
  tcp::Fd fd_;
  tcp::SocketAddress local_;
  int rank_ = 0;
};

}  // namespace braid
