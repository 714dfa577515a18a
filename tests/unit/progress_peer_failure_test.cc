// The engine's reading of a peer's failure: which calls it fails. Rank 2's
// call receives from ranks 0, 1 and 3 and then copies locally; the peers
// are driven by hand over socket pairs. Ranks 0 and 1 send their part and
// then fail, saying goodbye, all before rank 2's call runs; rank 3 sends
// its part at once or later. Whether rank 2's call fails depends on which
// call the goodbyes name.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "algorithms/schedule.h"
#include "src/call_tags.h"
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
constexpr int kRanks = 4, kMe = 2, kLive = 3;

std::unique_ptr<StreamConnection> streamEnd(int fd, int peer) {
  return std::make_unique<StreamConnection>(std::make_unique<tcp::SocketStream>(tcp::Fd(fd), peer),
                                            peer);
}

// Rank `rank`'s part of call #3, sent in full; false if the connection
// failed first (rank 2 gave up the call and closed it).
bool sendPart(StreamConnection& from, int rank) {
  std::vector<uint8_t> part(kBytes, static_cast<uint8_t>(rank + 1));
  auto sent = from.postSend(part.data(), kBytes, Tag{collectiveTagBase(0, 3), kCheck});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (sent->state() == transport::Request::State::kPending &&
         std::chrono::steady_clock::now() < deadline && from.progress().isOk()) {
  }
  return sent->state() == transport::Request::State::kDone;
}

double cpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// How ranks 0 and 1 end once they sent their part.
enum class Leaving {
  kFailedInCall,  // a failure goodbye naming a call
  kPlainAbort,    // a failure goodbye naming none
  kOrderlyClose,  // a goodbye that is no failure (a destroyed communicator)
  kVanished,      // no goodbye at all (a killed process)
};

// What rank 2 sees of call #3 on stream 0 when ranks 0 and 1 sent their
// part and then left as `leaving` says, a failure naming `failedCall` (0:
// no call named), and rank 3 sends its part after `liveDelay`.
class PeerFailedInCall : public ::testing::Test {
 protected:
  Status runRank2(uint64_t failedCall, Leaving leaving = Leaving::kFailedInCall,
                  std::chrono::milliseconds liveDelay = std::chrono::milliseconds(0)) {
    std::vector<std::unique_ptr<Connection>> own(kRanks);
    std::array<std::unique_ptr<StreamConnection>, kRanks> peerEnds;
    for (int peer = 0; peer < kRanks; ++peer) {
      if (peer == kMe) continue;
      int pair[2];
      EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair), 0);
      own[peer] = streamEnd(pair[0], peer);
      peerEnds[peer] = streamEnd(pair[1], kMe);
    }
    own[kMe] = std::make_unique<transport::LoopbackConnection>(kMe);
    for (int peer = 0; peer < 2; ++peer) {
      EXPECT_TRUE(sendPart(*peerEnds[peer], peer));
      const Status why = invalidUsage(strCat("rank ", peer, " found a mismatch"));
      switch (leaving) {
        case Leaving::kFailedInCall:
          peerEnds[peer]->abortInCall(why, failedCall);
          break;
        case Leaving::kPlainAbort:
          peerEnds[peer]->abort(why);
          break;
        case Leaving::kOrderlyClose:
          peerEnds[peer]->abort(Status::ok());
          break;
        case Leaving::kVanished:
          peerEnds[peer].reset();
          break;
      }
    }
    std::thread live([&] {
      std::this_thread::sleep_for(liveDelay);
      liveSent_ = sendPart(*peerEnds[kLive], kLive);
    });

    algo::Schedule schedule;
    algo::StepIndex arrived[kRanks];
    for (int peer : {0, 1, kLive})
      arrived[peer] = schedule.recv(peer, {algo::BufferId::kRecv, peer * kBytes, kBytes});
    const auto fromBoth = schedule.copy({algo::BufferId::kRecv, kMe * kBytes, kBytes},
                                        {algo::BufferId::kRecv, 0, kBytes}, arrived[0], arrived[1]);
    schedule.copy({algo::BufferId::kRecv, kRanks * kBytes, kBytes},
                  {algo::BufferId::kRecv, kLive * kBytes, kBytes}, fromBoth, arrived[kLive]);
    std::vector<Connection*> connections;
    for (auto& c : own) connections.push_back(c.get());
    Job job;
    job.schedule = &schedule;
    job.recv = received_.data();
    job.nranks = kRanks;
    job.rank = kMe;
    job.connections = connections;
    job.tagFor = [](bool, int, uint32_t k) {
      return Tag{collectiveTag(collectiveTagBase(0, 3), k), kCheck};
    };
    job.tagsBelow = collectiveTagBound(0, 3);
    job.callName = "braidAllGather #3";
    job.timeoutSeconds = 5;
    const Status s = runJobs({&job, 1});
    live.join();
    return s;
  }

  std::array<uint8_t, (kRanks + 1) * kBytes> received_{};
  bool liveSent_ = false;
};

TEST_F(PeerFailedInCall, APeerThatFailedInALaterCallDoesNotFailThisOne) {
  const Status s = runRank2(collectiveTagBound(0, 4));
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_TRUE(liveSent_);
  EXPECT_EQ(received_[0], 1);
  EXPECT_EQ(received_[kBytes], 2);
  EXPECT_EQ(received_[kLive * kBytes], kLive + 1);
  EXPECT_EQ(received_[kMe * kBytes], 1);  // the local steps after the receives ran
  EXPECT_EQ(received_[kRanks * kBytes], kLive + 1);
}

// The call still waits for rank 3, asleep: the closed sockets of ranks 0
// and 1 (always readable) are left out of the wait, which would otherwise
// spin on them until rank 3's part came; so too where they closed with no
// failure, or vanished with no goodbye.
class WaitingPastPeersThatLeft : public PeerFailedInCall,
                                 public ::testing::WithParamInterface<Leaving> {};

TEST_P(WaitingPastPeersThatLeft, Sleeps) {
  const double cpuBefore = cpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  const Status s = runRank2(collectiveTagBound(0, 4), GetParam(), std::chrono::milliseconds(500));
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu = cpuSeconds() - cpuBefore;
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(received_[kRanks * kBytes], kLive + 1);
  EXPECT_GE(wall, 0.5);
  EXPECT_LT(cpu, 0.5 * wall) << "the call spent " << cpu << " s of CPU in " << wall << " s";
}

INSTANTIATE_TEST_SUITE_P(Leaving, WaitingPastPeersThatLeft,
                         ::testing::Values(Leaving::kFailedInCall, Leaving::kOrderlyClose,
                                           Leaving::kVanished));

TEST_F(PeerFailedInCall, APeerThatFailedInThisCallFailsIt) {
  const Status s = runRank2(collectiveTagBound(0, 3));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidUsage) << s.message();
  EXPECT_NE(s.message().find("braidAllGather #3 on rank 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("found a mismatch"), std::string::npos) << s.message();
}

TEST_F(PeerFailedInCall, APeerThatFailedInAnEarlierCallFailsThisOne) {
  EXPECT_FALSE(runRank2(collectiveTagBound(0, 2)).isOk());
}

// Calls on different streams have no order between them.
TEST_F(PeerFailedInCall, AFailureInALaterCallOfAnotherStreamFailsThisOne) {
  EXPECT_FALSE(runRank2(collectiveTagBound(2, 4)).isOk());
}

// braidCommAbort, a lost process or a failed point-to-point call name no
// call: every call that is still running fails.
TEST_F(PeerFailedInCall, AFailureThatNamesNoCallFailsThisOne) {
  EXPECT_FALSE(runRank2(0).isOk());
  EXPECT_FALSE(runRank2(0, Leaving::kPlainAbort).isOk());
}

}  // namespace
}  // namespace braid
