#include "transports/tcp/tcp_transport.h"

#include <algorithm>
#include <future>
#include <set>

#include "src/common/log.h"

namespace braid::tcp {

namespace {
constexpr uint32_t kDataPurpose = 2;
}

Result<std::unique_ptr<TcpTransport>> TcpTransport::create(const SocketAddress& bindAddress,
                                                           const Secret& secret) {
  SocketAddress any = bindAddress;
  any.setPort(0);
  BRAID_ASSIGN_OR_RETURN(Fd listener, listenOn(any));
  BRAID_ASSIGN_OR_RETURN(SocketAddress bound, SocketAddress::ofSocket(listener.get(), false));
  return std::unique_ptr<TcpTransport>(new TcpTransport(std::move(listener), bound, secret));
}

Result<std::map<int, Fd>> TcpTransport::connectPeers(int rank, std::span<const int> peers,
                                                     const std::vector<std::string>& addresses,
                                                     Deadline deadline) {
  std::set<int> higher;
  std::vector<int> lower;
  for (int p : peers) (p > rank ? (void)higher.insert(p) : lower.push_back(p));

  // Accept the higher ranks on a helper thread while dialing the lower ones,
  // so that no rank waits on a chain of others.
  auto accepted = std::async(std::launch::async, [&]() -> Result<std::map<int, Fd>> {
    std::map<int, Fd> out;
    while (out.size() < higher.size()) {
      BRAID_ASSIGN_OR_RETURN(Fd fd, acceptFrom(listener_.get(), deadline));
      // A connection that does not prove itself soon is a stranger: it may
      // cost this rank 10 s of its init, not the whole timeout.
      auto peer = handshakeAccept(fd.get(), secret_, kDataPurpose, deadline.within(10.0));
      if (!peer.isOk()) {
        BRAID_WARN("refused a connection: ", peer.status().message());
        continue;
      }
      if (!higher.count(*peer) || out.count(*peer)) {
        BRAID_WARN("refused a connection claiming rank ", *peer);
        continue;
      }
      out.emplace(*peer, std::move(fd));
    }
    return out;
  });

  std::map<int, Fd> connections;
  Status dialStatus;
  for (int p : lower) {
    // Published by the peer as numbers (localAddress()): nothing to resolve.
    auto address = SocketAddress::parseNumeric(addresses[p]);
    if (!address.isOk()) {
      dialStatus = address.status();
      break;
    }
    auto fd = connectTo(*address, deadline);
    if (!fd.isOk()) {
      dialStatus = fd.status().withContext(strCat("connecting to rank ", p));
      break;
    }
    Status shook = handshakeConnect(fd->get(), secret_, kDataPurpose, rank, deadline);
    if (!shook.isOk()) {
      dialStatus = shook.withContext(strCat("connecting to rank ", p));
      break;
    }
    connections.emplace(p, std::move(*fd));
  }
  auto acceptedFds = accepted.get();
  BRAID_RETURN_IF_ERROR(dialStatus);
  if (!acceptedFds.isOk())
    return acceptedFds.status().withContext("waiting for higher ranks to connect");
  for (auto& [p, fd] : *acceptedFds) connections.emplace(p, std::move(fd));
  BRAID_INFO("tcp: rank ", rank, " connected to ", connections.size(), " peers from ",
             localAddress());
  return connections;
}

}  // namespace braid::tcp
