// The TCP connection's contract, over a connected socket pair: tagged
// matching in any order, direct and staged payloads, mismatch detection,
// and failure when the peer goes away.
#include "transports/tcp/tcp_connection.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <numeric>

namespace braid::tcp {
namespace {

using transport::Request;
using transport::RequestPtr;
using transport::Tag;

struct Pair {
  std::unique_ptr<TcpConnection> a, b;
  Pair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    a = std::make_unique<TcpConnection>(Fd(fds[0]), 1);
    b = std::make_unique<TcpConnection>(Fd(fds[1]), 0);
  }
  // Drives both ends until every request is no longer pending (or 5 s).
  void drive(std::initializer_list<RequestPtr> requests) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      if (a) (void)a->progress();
      if (b) (void)b->progress();
      bool pending = false;
      for (const auto& r : requests) pending = pending || r->state() == Request::State::kPending;
      if (!pending) return;
    }
    ADD_FAILURE() << "requests still pending after 5 s";
  }
};

Tag tag(uint64_t value, uint64_t check = 7) {
  return {value, check};
}

TEST(TcpConnection, MatchesReceivesPostedInAnyOrder) {
  Pair p;
  std::vector<int> out[3] = {{1, 2}, {3, 4, 5}, {6}};
  std::vector<int> in[3] = {std::vector<int>(2), std::vector<int>(3), std::vector<int>(1)};
  RequestPtr r2 = p.b->postRecv(in[2].data(), 4, tag(3));
  RequestPtr r0 = p.b->postRecv(in[0].data(), 8, tag(1));
  RequestPtr s0 = p.a->postSend(out[0].data(), 8, tag(1));
  RequestPtr s1 = p.a->postSend(out[1].data(), 12, tag(2));
  RequestPtr s2 = p.a->postSend(out[2].data(), 4, tag(3));
  p.drive({s0, s1, s2, r0, r2});
  // Message 2 arrived before its receive was posted: it waits as unexpected.
  RequestPtr r1 = p.b->postRecv(in[1].data(), 12, tag(2));
  EXPECT_EQ(r1->state(), Request::State::kDone);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(in[i], out[i]);
}

TEST(TcpConnection, MovesLargeMessagesBothWays) {
  Pair p;
  std::vector<uint8_t> big(8 << 20), back(8 << 20), got(8 << 20), gotBack(8 << 20);
  std::iota(big.begin(), big.end(), 0);
  std::iota(back.begin(), back.end(), 7);
  RequestPtr s1 = p.a->postSend(big.data(), big.size(), tag(1));
  RequestPtr s2 = p.b->postSend(back.data(), back.size(), tag(1));
  RequestPtr r1 = p.b->postRecv(got.data(), got.size(), tag(1));
  RequestPtr r2 = p.a->postRecv(gotBack.data(), gotBack.size(), tag(1));
  p.drive({s1, s2, r1, r2});
  EXPECT_EQ(got, big);
  EXPECT_EQ(gotBack, back);
}

TEST(TcpConnection, ZeroByteMessages) {
  Pair p;
  RequestPtr s = p.a->postSend(nullptr, 0, tag(9));
  RequestPtr r = p.b->postRecv(nullptr, 0, tag(9));
  p.drive({s, r});
  EXPECT_EQ(r->state(), Request::State::kDone);
}

TEST(TcpConnection, DifferentCheckFailsWithTheSendersCheck) {
  Pair p;
  int x = 1, y = 0;
  RequestPtr r = p.b->postRecv(&y, 4, tag(1, 100));
  RequestPtr s = p.a->postSend(&x, 4, tag(1, 200));
  p.drive({s, r});
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kInvalidUsage);
  EXPECT_EQ(r->mismatch().check, 200u);
}

TEST(TcpConnection, DifferentSizeFails) {
  Pair p;
  int x[2] = {1, 2}, y[4] = {};
  RequestPtr s = p.a->postSend(x, 8, tag(1));
  RequestPtr r = p.b->postRecv(y, 16, tag(1));
  p.drive({s, r});
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kInvalidUsage);
}

TEST(TcpConnection, ReceiveOvertakenInItsChannelFails) {
  Pair p;
  int x = 1, y = 0, z = 0;
  // The sender skipped tag 5 of channel 0 and went on to tag 6.
  RequestPtr waiting = p.b->postRecv(&y, 4, tag(5));
  RequestPtr s = p.a->postSend(&x, 4, tag(6));
  RequestPtr other = p.b->postRecv(&z, 4, tag((uint64_t{2} << 56) | 1));
  p.drive({s, waiting});
  EXPECT_EQ(waiting->state(), Request::State::kFailed);
  EXPECT_EQ(other->state(), Request::State::kPending) << "another channel is unaffected";
  RequestPtr late = p.b->postRecv(&y, 4, tag(4));
  EXPECT_EQ(late->state(), Request::State::kFailed)
      << "a receive posted after the overtake fails at once";
}

TEST(TcpConnection, PeerClosingFailsPendingRequests) {
  Pair p;
  int y = 0;
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  p.a.reset();
  p.drive({r});
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kRemoteError);
  EXPECT_NE(r->error().message().find("rank 0"), std::string::npos) << r->error().message();
}

TEST(TcpConnection, AbortFailsPendingAndLaterRequests) {
  Pair p;
  int y = 0;
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  p.b->abort(invalidUsage("communicator aborted"));
  EXPECT_EQ(r->state(), Request::State::kFailed);
  RequestPtr later = p.b->postSend(&y, 4, tag(2));
  EXPECT_EQ(later->state(), Request::State::kFailed);
  EXPECT_EQ(later->error().code(), ErrorCode::kInvalidUsage);
}

}  // namespace
}  // namespace braid::tcp

namespace braid::tcp {
namespace {

TEST(TcpConnection, MessageThatArrivedBeforeThePeerClosedIsDelivered) {
  Pair p;
  int x = 42, y = 0;
  RequestPtr s = p.a->postSend(&x, 4, tag(1));
  p.drive({s});
  p.a.reset();
  // Reading sees the message, then the end of the stream.
  for (int i = 0; i < 100; ++i) (void)p.b->progress();
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  EXPECT_EQ(r->state(), Request::State::kDone);
  EXPECT_EQ(y, 42);
}

}  // namespace
}  // namespace braid::tcp
