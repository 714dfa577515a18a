// The engine's reading of a peer's failure: which calls it fails. Rank 2's
// call receives from ranks 0 and 1 and then copies locally; ranks 0 and 1
// are driven by hand over socket pairs: they send their part, then fail
// and say goodbye, all before rank 2's call runs. Whether rank 2's call
// fails depends on which call their goodbye names.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "algorithms/schedule.h"
#include "src/common/strcat.h"
#include "src/progress.h"
#include "transports/loopback/loopback_connection.h"
#include "transports/stream_connection.h"
#include "transports/tcp/socket_stream.h"

namespace braid {
namespace {

using transport::Connection;
using transport::StreamConnection;
using transport::Tag;

constexpr uint64_t kCheck = 0x5eed;
constexpr size_t kBytes = 64;

// The tags of call `sequence` on collective channel `channel`, as the
// communicator numbers them: the call's tags, and the bound below them all.
uint64_t callBase(int channel, uint32_t sequence) {
  return (uint64_t(channel) << 56) | (uint64_t{sequence} << 24);
}
uint64_t callBound(int channel, uint32_t sequence) {
  return callBase(channel, sequence) + (uint64_t{1} << 24);
}

std::unique_ptr<StreamConnection> streamEnd(int fd, int peer) {
  return std::make_unique<StreamConnection>(std::make_unique<tcp::SocketStream>(tcp::Fd(fd), peer),
                                            peer);
}

void waitFor(const transport::RequestPtr& request, Connection& connection) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (request->state() == transport::Request::State::kPending &&
         std::chrono::steady_clock::now() < deadline)
    ASSERT_TRUE(connection.progress().isOk());
  ASSERT_EQ(request->state(), transport::Request::State::kDone);
}

// What rank 2 sees of a call #3 on channel 0 whose peers sent their part
// and then failed, naming `failedCall` (0: no call named) in their goodbye.
class PeerFailure : public ::testing::Test {
 protected:
  Status runRank2(uint64_t failedCall, bool plainAbort = false) {
    std::vector<std::unique_ptr<Connection>> own(3);
    std::array<std::unique_ptr<StreamConnection>, 2> peerEnds;
    for (int peer = 0; peer < 2; ++peer) {
      int pair[2];
      EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair), 0);
      own[peer] = streamEnd(pair[0], peer);
      peerEnds[peer] = streamEnd(pair[1], 2);
    }
    own[2] = std::make_unique<transport::LoopbackConnection>(2);
    for (int peer = 0; peer < 2; ++peer) {
      std::vector<uint8_t> part(kBytes, static_cast<uint8_t>(peer + 1));
      auto sent = peerEnds[peer]->postSend(part.data(), kBytes, Tag{callBase(0, 3) | 0, kCheck});
      waitFor(sent, *peerEnds[peer]);
      const Status why = invalidUsage(strCat("rank ", peer, " found a mismatch"));
      if (plainAbort)
        peerEnds[peer]->abort(why);
      else
        peerEnds[peer]->abortInCall(why, failedCall);
    }

    algo::Schedule schedule;
    const auto from0 = schedule.recv(0, {algo::BufferId::kRecv, 0, kBytes});
    const auto from1 = schedule.recv(1, {algo::BufferId::kRecv, kBytes, kBytes});
    schedule.copy({algo::BufferId::kRecv, 2 * kBytes, kBytes}, {algo::BufferId::kRecv, 0, kBytes},
                  from0, from1);
    std::vector<Connection*> connections;
    for (auto& c : own) connections.push_back(c.get());
    Job job;
    job.schedule = &schedule;
    job.recv = received_.data();
    job.nranks = 3;
    job.rank = 2;
    job.connections = connections;
    const uint64_t base = callBase(0, 3);
    job.tagFor = [base](bool, int, uint32_t k) { return Tag{base | k, kCheck}; };
    job.tagsBelow = callBound(0, 3);
    job.callName = "braidAllGather #3";
    job.timeoutSeconds = 5;
    return runJobs({&job, 1});
  }

  std::array<uint8_t, 3 * kBytes> received_{};
};

TEST_F(PeerFailure, APeerThatFailedInALaterCallDoesNotFailThisOne) {
  const Status s = runRank2(callBound(0, 4));
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(received_[0], 1);
  EXPECT_EQ(received_[kBytes], 2);
  EXPECT_EQ(received_[2 * kBytes], 1);  // the local step after the receives ran
}

TEST_F(PeerFailure, APeerThatFailedInThisCallFailsIt) {
  const Status s = runRank2(callBound(0, 3));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidUsage) << s.message();
  EXPECT_NE(s.message().find("braidAllGather #3 on rank 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("found a mismatch"), std::string::npos) << s.message();
}

TEST_F(PeerFailure, APeerThatFailedInAnEarlierCallFailsThisOne) {
  EXPECT_FALSE(runRank2(callBound(0, 2)).isOk());
}

// Calls on different streams have no order between them.
TEST_F(PeerFailure, AFailureInALaterCallOfAnotherStreamFailsThisOne) {
  EXPECT_FALSE(runRank2(callBound(2, 4)).isOk());
}

// braidCommAbort, a lost process or a failed point-to-point call name no
// call: every call that is still running fails.
TEST_F(PeerFailure, AFailureThatNamesNoCallFailsThisOne) {
  EXPECT_FALSE(runRank2(0).isOk());
  EXPECT_FALSE(runRank2(0, /*plainAbort=*/true).isOk());
}

}  // namespace
}  // namespace braid
