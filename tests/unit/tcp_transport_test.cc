// tcp_transport.h: how ranks connect their data sockets at init.
#include "transports/tcp/tcp_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace braid::tcp {
namespace {

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
