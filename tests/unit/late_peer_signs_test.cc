// What the first GPU call on a CUDA stream reads on the shared-memory board
// to tell a peer late for its own first GPU call from one that waits for
// this rank (src/gpu_path.h, settleHandshakes): which ranks wait, directly or
// through a rank that waits, and which did so on every look for a while.
// Three in-process mappings of one board stand for the ranks' views.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "src/board_collectives.h"
#include "src/call_signature.h"
#include "src/communicator.h"
#include "src/steadily_waiting.h"
#include "transports/shm/shm_board.h"

namespace braid {
namespace {

constexpr int kRanks = 3, kStreams = 4;

class LatePeerSigns : public ::testing::Test {
 protected:
  void SetUp() override {
    auto created = shm::Board::create(kRanks, kStreams, 1, 48);
    ASSERT_TRUE(created.isOk()) << created.status().message();
    const std::string name = created->name();
    std::vector<shm::Board> boards;
    boards.push_back(std::move(*created));
    for (int rank = 1; rank < kRanks; ++rank) {
      auto opened = shm::Board::open(name, kRanks, kStreams, 1, 48);
      ASSERT_TRUE(opened.isOk()) << opened.status().message();
      boards.push_back(std::move(*opened));
    }
    boards[0].unlink();
    for (int rank = 0; rank < kRanks; ++rank)
      views_.push_back(
          std::make_unique<BoardCollectives>(std::move(boards[rank]), rank, kRanks, false));
  }

  BoardCollectives& rank(int r) { return *views_[static_cast<size_t>(r)]; }
  // Rank `r` counts a Send or Recv with `peer` under way (1) or ended (-1).
  void pointToPoint(int r, int peer, int delta, bool isSend = false) {
    const Operation op = byteTransfer(isSend, peer, &byte_, 1, "test");
    rank(r).countPointToPoint({&op, 1}, delta);
  }
  std::vector<bool> seenByRankZero() { return rank(0).ranksWaitingForThisRank(); }

  std::vector<std::unique_ptr<BoardCollectives>> views_;
  char byte_ = 0;
};

const std::vector<bool> kNone{false, false, false};

TEST_F(LatePeerSigns, ASendOrRecvWithThisRankWaitsForItWhileItIsUnderWay) {
  EXPECT_EQ(seenByRankZero(), kNone);
  {
    const Operation recv = byteTransfer(false, 0, &byte_, 1, "test");
    const CountedWhileUnderWay underWay([&](int delta) {
      rank(1).countPointToPoint({&recv, 1}, delta);
    });
    EXPECT_EQ(seenByRankZero(), (std::vector<bool>{false, true, false}));
  }
  EXPECT_EQ(seenByRankZero(), kNone);  // ended: no longer counted
  pointToPoint(2, 0, 1, /*isSend=*/true);
  EXPECT_EQ(seenByRankZero(), (std::vector<bool>{false, false, true}));
}

TEST_F(LatePeerSigns, AMatchUnderWayOnBothSidesIsNotWaiting) {
  pointToPoint(1, 0, 1);
  pointToPoint(0, 1, 1, /*isSend=*/true);
  EXPECT_EQ(seenByRankZero(), kNone);
}

TEST_F(LatePeerSigns, ARankWaitsThroughARankThatWaits) {
  pointToPoint(2, 1, 1);  // rank 2 receives from rank 1
  pointToPoint(1, 0, 1);  // which receives from rank 0
  EXPECT_EQ(seenByRankZero(), (std::vector<bool>{false, true, true}));
}

TEST_F(LatePeerSigns, AWaitThatDoesNotLeadToThisRankIsNotWaitingForIt) {
  pointToPoint(2, 1, 1);  // rank 1 is only late
  EXPECT_EQ(seenByRankZero(), kNone);
  EXPECT_EQ(rank(1).ranksWaitingForThisRank(), (std::vector<bool>{false, false, true}));
}

TEST_F(LatePeerSigns, AHostCollectiveNotAnnouncedByARankWaitsForIt) {
  CallSignature host;
  host.count = 8;
  rank(2).announce(3, 0, host.pack());  // on the last stream
  EXPECT_EQ(seenByRankZero(), (std::vector<bool>{false, false, true}));
  rank(1).announce(3, 0, host.pack());
  EXPECT_EQ(seenByRankZero(), (std::vector<bool>{false, true, true}));
  rank(0).announce(3, 0, host.pack());  // all made it: no one waits
  EXPECT_EQ(seenByRankZero(), kNone);
}

TEST_F(LatePeerSigns, AGpuCollectiveIsNotWaiting) {
  CallSignature gpu;
  gpu.count = 8;
  gpu.gpuMemory = true;
  rank(2).announce(0, 0, gpu.pack());
  rank(1).announce(0, 0, gpu.pack());
  EXPECT_EQ(seenByRankZero(), kNone);
}

// Rank 1 waits for rank 0 in a Recv; rank 2 waits in a host collective that
// rank 0 (on another thread) announced but rank 1 has not: it waits too.
TEST_F(LatePeerSigns, AHostCollectiveWaitsForARankThatWaits) {
  CallSignature host;
  host.count = 8;
  rank(2).announce(1, 0, host.pack());
  rank(0).announce(1, 0, host.pack());
  EXPECT_EQ(seenByRankZero(), kNone);  // rank 1 is only late
  pointToPoint(1, 0, 1);
  EXPECT_EQ(seenByRankZero(), (std::vector<bool>{false, true, true}));
}

// Past the wrap of the 32-bit call index: ranks at its last call (index
// 2^32 - 1) wait for a rank one call behind, and a rank that announced
// nothing yet is no mismatch of that call.
TEST_F(LatePeerSigns, CallsAcrossTheWrapOfTheCallIndexKeepTheirOrder) {
  CallSignature host;
  host.count = 8;
  rank(0).announce(0, 0xfffffffe, host.pack());
  rank(1).announce(0, 0xffffffff, host.pack());
  rank(2).announce(0, 0xffffffff, host.pack());
  EXPECT_EQ(seenByRankZero(), (std::vector<bool>{false, true, true}));
  rank(0).announce(0, 0xffffffff, host.pack());
  rank(2).announce(0, 0, host.pack());  // past the wrap
  EXPECT_EQ(rank(0).ranksWaitingForThisRank(), (std::vector<bool>{false, false, true}));
  EXPECT_EQ(rank(2).ranksWaitingForThisRank(), kNone);
  // Stream 1: nothing announced by ranks 1 and 2.
  rank(0).announce(1, 0xffffffff, host.pack());
  EXPECT_TRUE(rank(0).checkAnnouncements(1, 0xffffffff, host.pack(), "test").isOk());
  // A different call announced for the same index is a mismatch.
  CallSignature other = host;
  other.count = 9;
  rank(1).announce(1, 0xffffffff, other.pack());
  EXPECT_FALSE(rank(0).checkAnnouncements(1, 0xffffffff, host.pack(), "test").isOk());
}

TEST(SteadilyWaiting, OnlyARankSeenWaitingOnEveryLookForTheWhile) {
  SteadilyWaiting waiting(0.05);
  EXPECT_FALSE(waiting.steadily(1, 0));  // nothing looked at yet
  waiting.look({false, true, true}, 1.00);
  EXPECT_FALSE(waiting.steadily(1, 1.04));
  waiting.look({false, true, false}, 1.04);  // rank 2 not waiting: starts again
  waiting.look({false, true, true}, 1.05);
  EXPECT_TRUE(waiting.steadily(1, 1.05));
  EXPECT_FALSE(waiting.steadily(2, 1.05));
  EXPECT_FALSE(waiting.steadily(2, 1.09));
  EXPECT_TRUE(waiting.steadily(2, 1.10));
  EXPECT_FALSE(waiting.steadily(0, 1.10));
  EXPECT_FALSE(waiting.steadily(3, 1.10));  // no such rank
  EXPECT_FALSE(waiting.steadily(-1, 1.10));
  waiting.look({}, 1.20);  // a look that shows no rank: none waits
  EXPECT_FALSE(waiting.steadily(1, 1.30));
}

}  // namespace
}  // namespace braid
