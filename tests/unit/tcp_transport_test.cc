// tcp_transport.h: how ranks connect their data sockets at init.
#include "transports/tcp/tcp_transport.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace braid::tcp {
namespace {

// A socket bound to a port and then connected to that same port, with no
// one listening, is connected to itself (a simultaneous open): what a
// dialling rank gets when the kernel picks the dialled port as its source.
// connectTo takes it for "nothing listens there", not for the peer.
TEST(TcpSocket, AConnectionToItselfIsToldFromOneToAListener) {
  Fd self(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(self.valid());
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(self.get(), reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0);
  socklen_t length = sizeof(at);
  ASSERT_EQ(::getsockname(self.get(), reinterpret_cast<sockaddr*>(&at), &length), 0);
  ASSERT_EQ(::connect(self.get(), reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0);
  EXPECT_TRUE(connectedToItself(self.get()));

  auto loopback = SocketAddress::parse("127.0.0.1:0");
  ASSERT_TRUE(loopback.isOk());
  auto listener = listenOn(*loopback);
  ASSERT_TRUE(listener.isOk()) << listener.status().message();
  auto listening = SocketAddress::ofSocket(listener->get(), false);
  ASSERT_TRUE(listening.isOk());
  auto dialled = connectTo(*listening, Deadline::after(5));
  ASSERT_TRUE(dialled.isOk()) << dialled.status().message();
  EXPECT_FALSE(connectedToItself(dialled->get()));
}

// The local ports of this host's sockets dialling 127.0.0.1:`port` whose
// handshake is under way (SYN_SENT), from /proc/net/tcp.
std::set<std::string> dialsUnderWay(uint16_t port) {
  std::set<std::string> out;
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // the header
  char remote[16];
  std::snprintf(remote, sizeof(remote), "0100007F:%04X", port);
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, rem, state;
    if (fields >> slot >> local >> rem >> state && rem == remote && state == "02")
      out.insert(local);
  }
  return out;
}

// A dial whose handshake outlasts one slice of a deadline that a flag may
// end (50 ms) goes on with the same socket; before, it was closed and dialled
// again every slice, so a handshake slower than that never finished. A full
// listen queue makes the handshake wait for its SYN's retransmission.
TEST(TcpSocket, ADialOutlastsTheSlicesOfADeadlineAFlagMayEnd) {
  auto loopback = SocketAddress::parse("127.0.0.1:0");
  ASSERT_TRUE(loopback.isOk());
  auto listener = listenOn(*loopback);
  ASSERT_TRUE(listener.isOk()) << listener.status().message();
  ASSERT_EQ(::listen(listener->get(), 0), 0);
  auto listening = SocketAddress::ofSocket(listener->get(), false);
  ASSERT_TRUE(listening.isOk());
  // Fill the queue: dial until a dial does not complete at once.
  std::vector<Fd> queued;
  for (int i = 0; i < 16; ++i) {
    auto filled = connectTo(*listening, Deadline::after(0.2));
    if (!filled.isOk()) break;
    queued.push_back(std::move(*filled));
  }
  ASSERT_FALSE(queued.empty());
  std::atomic<bool> flag{false}, dialEnded{false};
  Result<Fd> dialled = internalError("not dialled");
  std::thread dialler([&] {
    dialled = connectTo(*listening, Deadline::after(10).endedBy(&flag));
    dialEnded = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const std::set<std::string> early = dialsUnderWay(listening->port());
  std::this_thread::sleep_for(std::chrono::milliseconds(450));
  const std::set<std::string> later = dialsUnderWay(listening->port());
  // Room in the queue, kept until the dial ends (a handshake that completes
  // just as an attempt gives up leaves its connection there): the dial
  // completes.
  std::vector<Fd> accepted;
  while (!dialEnded) {
    auto next = acceptFrom(listener->get(), Deadline::after(0.05));
    if (next.isOk()) accepted.push_back(std::move(*next));
  }
  dialler.join();
  ASSERT_EQ(early.size(), 1u) << "one dial under way at 150 ms";
  EXPECT_EQ(later, early) << "the dial of 150 ms was dropped by 600 ms";
  EXPECT_TRUE(dialled.isOk()) << dialled.status().message();
}

// Connections to a rank's data port that never prove themselves (a port
// scanner, a stray client) are handshaken beside the ranks', not before
// them: two silent ones held up the higher rank for 10 s each, and a few
// dozen used up the whole timeout.
TEST(TcpTransport, SilentStrangersOnTheDataPortHoldUpNoRank) {
  Secret secret{};
  secret.fill(0x3c);
  auto loopback = SocketAddress::parse("127.0.0.1:0");
  ASSERT_TRUE(loopback.isOk());
  auto first = TcpTransport::create(*loopback, secret);
  auto second = TcpTransport::create(*loopback, secret);
  ASSERT_TRUE(first.isOk()) << first.status().message();
  ASSERT_TRUE(second.isOk()) << second.status().message();
  const std::vector<std::string> addresses{(*first)->localAddress(), (*second)->localAddress()};

  auto rankZero = SocketAddress::parseNumeric(addresses[0]);
  ASSERT_TRUE(rankZero.isOk());
  std::vector<Fd> strangers;
  for (int i = 0; i < 3; ++i) {
    auto silent = connectTo(*rankZero, Deadline::after(5));
    ASSERT_TRUE(silent.isOk()) << silent.status().message();
    strangers.push_back(std::move(*silent));
  }

  const auto start = std::chrono::steady_clock::now();
  Result<std::map<int, Fd>> zero = internalError("not run"), one = internalError("not run");
  std::thread acceptor([&] {
    const int peers[] = {1};
    zero = (*first)->connectPeers(0, peers, addresses, Deadline::after(30));
  });
  const int peers[] = {0};
  one = (*second)->connectPeers(1, peers, addresses, Deadline::after(30));
  acceptor.join();
  ASSERT_TRUE(zero.isOk()) << zero.status().message();
  ASSERT_TRUE(one.isOk()) << one.status().message();
  EXPECT_EQ(zero->count(1), 1u);
  EXPECT_EQ(one->count(0), 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

}  // namespace
}  // namespace braid::tcp
