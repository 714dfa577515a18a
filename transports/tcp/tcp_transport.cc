#include "transports/tcp/tcp_transport.h"

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <set>
#include <thread>
#include <vector>

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

Result<std::map<int, Fd>> TcpTransport::acceptHigherRanks(const std::set<int>& higher,
                                                          Deadline deadline) {
  // Each connection proves itself on a thread of its own: one that does not
  // (a port scanner, a stray client) may take 10 s of its own, not of the
  // ranks that connect after it. At most kMaxGreetings at once; more wait
  // in the listen backlog.
  struct Greeting {
    Fd fd;  // closed only after the handshake's thread, which uses it, ended
    std::future<Result<int32_t>> peer;
  };
  constexpr size_t kMaxGreetings = 64;
  std::vector<Greeting> greetings;
  // Ends the handshakes still under way (their threads join as the
  // futures go).
  auto cutOff = [&] {
    for (Greeting& g : greetings) ::shutdown(g.fd.get(), SHUT_RDWR);
    greetings.clear();
  };
  std::map<int, Fd> out;
  while (out.size() < higher.size()) {
    if (greetings.size() < kMaxGreetings) {
      auto fd = acceptFrom(listener_.get(), deadline.within(0.005));
      if (fd.isOk()) {
        const int raw = fd->get();
        greetings.push_back({std::move(*fd), std::async(std::launch::async, [this, raw, deadline] {
                               return handshakeAccept(raw, secret_, kDataPurpose,
                                                      deadline.within(10.0));
                             })});
      } else if (fd.status().code() != ErrorCode::kTimeout || deadline.expired()) {
        cutOff();
        return fd.status();
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (auto g = greetings.begin(); g != greetings.end();) {
      if (g->peer.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        ++g;
        continue;
      }
      Result<int32_t> peer = g->peer.get();
      if (!peer.isOk())
        BRAID_WARN("refused a connection: ", peer.status().message());
      else if (!higher.count(*peer) || out.count(*peer))
        BRAID_WARN("refused a connection claiming rank ", *peer);
      else
        out.emplace(*peer, std::move(g->fd));
      g = greetings.erase(g);
    }
  }
  cutOff();
  return out;
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
    return acceptHigherRanks(higher, deadline);
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
