// The algorithm selector and its link model: names in BRAID_ALGO, forced
// choices, the cost model's picks, and the shortlist it hands the tuner;
// and what a rank that aborted its own call tells its peers.
#include "src/selector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <string>

#include "src/common/env.h"
#include "src/link_probe.h"
#include "src/progress.h"

namespace braid {
namespace {

TEST(Selector, UnknownNamesInBraidAlgoAreErrorsListingTheKnownOnes) {
  auto bad = Selector::validate({{"allreduce", "teleport"}});
  EXPECT_EQ(bad.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("teleport"), std::string::npos);
  EXPECT_NE(bad.message().find("ring"), std::string::npos) << bad.message();
  auto badCollective = Selector::validate({{"allreduse", "ring"}});
  EXPECT_EQ(badCollective.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(badCollective.message().find("allreduse"), std::string::npos);
  EXPECT_TRUE(Selector::validate({{"allreduce", "ring"}, {"broadcast", "tree"}}).isOk());
}

TEST(Selector, ForcedAlgorithmWinsOverTheModel) {
  Selector s({{"allreduce", "ring"}}, algo::LinkModel{});
  algo::CollectiveArgs args;
  args.nranks = 4;
  for (size_t count : {size_t{1}, size_t{1} << 24}) {
    args.count = count;
    EXPECT_EQ(s.choose(args).name, "ring");
  }
}

TEST(Selector, ChoosesTheLowestEstimate) {
  Selector s({}, algo::LinkModel{});
  for (int P : {2, 3, 8, 64})
    for (size_t count : {size_t{1}, size_t{1000}, size_t{1} << 22}) {
      algo::CollectiveArgs args;
      args.nranks = P;
      args.count = count;
      const algo::Algorithm& chosen = s.choose(args);
      for (const auto& a : algo::allAlgorithms()) {
        if (a.kind != args.kind) continue;
        EXPECT_LE(chosen.estimate(args, s.link()).seconds, a.estimate(args, s.link()).seconds)
            << chosen.name << " vs " << a.name << " P=" << P << " count=" << count;
      }
    }
}

// At 2 ranks the model ties ring, halving and dbtree (each rank sends and
// reduces half the vector in two rounds); dbtree measured fastest there.
TEST(Selector, TwoRankTiesAmongTheBandwidthAlgorithmsGoToDbtree) {
  algo::LinkModel link;
  link.alpha = 0.6e-6;
  link.beta = 1.0 / 17e9;
  link.gamma = 1.0 / 43e9;
  Selector s({}, link);
  algo::CollectiveArgs args;
  args.nranks = 2;
  for (size_t bytes : {size_t{1} << 17, size_t{1} << 21, size_t{1} << 25}) {
    args.count = bytes / 4;
    const double ring = algo::findAlgorithm(args.kind, "ring")->estimate(args, link).seconds;
    const double dbtree = algo::findAlgorithm(args.kind, "dbtree")->estimate(args, link).seconds;
    EXPECT_NEAR(ring, dbtree, ring * 1e-9) << bytes;
    EXPECT_EQ(s.choose(args).name, "dbtree") << bytes;
  }
}

// Figures measured with every rank of a host busy already hold its
// sharing; only fewer busy ranks change a round's time.
TEST(LinkModel, StretchIsRelativeToTheBusyRanksOfTheMeasurement) {
  algo::LinkModel link;
  link.coresPerHost = 2;
  link.ranksPerHost = 3;
  // Measured by two ranks: the cores are shared evenly beyond them.
  EXPECT_DOUBLE_EQ(link.stretch(2, 3), 1.0);
  EXPECT_DOUBLE_EQ(link.stretch(3, 3), 1.5);
  // Measured by all three, 2.5 times as slow as by two.
  link.busyWhenMeasured = 3;
  link.contention = 2.5;
  EXPECT_DOUBLE_EQ(link.stretch(3, 3), 1.0);
  EXPECT_DOUBLE_EQ(link.stretch(2, 3), 1 / 2.5);
  EXPECT_DOUBLE_EQ(link.stretch(1, 3), 1 / 2.5);
  // Without a measured contention, an even share: 3 busy on 2 cores is 1.5.
  link.contention = 1.0;
  EXPECT_DOUBLE_EQ(link.stretch(2, 3), 1 / 1.5);
  // Ranks that do not outnumber the cores never stretch.
  link.coresPerHost = 4;
  link.busyWhenMeasured = 3;
  link.contention = 1.7;
  EXPECT_DOUBLE_EQ(link.stretch(3, 3), 1.0);
  EXPECT_DOUBLE_EQ(link.stretch(1, 3), 1.0);
}

// 3 ranks on 2 cores, with the figures the probe measured there: halving's
// fold leaves one rank waiting, so its rounds run on a core each and beat
// the ring, which keeps all three busy (measured: 268 against 362 us at
// 1 MiB, perf/tuner_check.py). An even share of the cores predicted the ring.
TEST(Selector, ThreeRanksOnTwoCoresPreferTheFoldToTheRing) {
  algo::LinkModel link;
  link.alpha = 2e-6;
  link.beta = 1.0 / 7.5e9;
  link.gamma = 1.0 / 40e9;
  link.coresPerHost = 2;
  link.ranksPerHost = 3;
  link.busyWhenMeasured = 3;
  link.contention = 2.5;
  Selector s({}, link);
  algo::CollectiveArgs args;
  args.nranks = 3;
  for (size_t bytes : {size_t{256} << 10, size_t{1} << 20}) {
    args.count = bytes / 4;
    EXPECT_EQ(s.choose(args).name, "halving") << bytes;
  }
}

// Between the cached size (1 MiB) and the uncached one (4 MiB) the figures
// move in step with log2 of the size: 2 MiB is half way.
TEST(LinkModel, AtSizeMovesToTheUncachedFigures) {
  algo::LinkModel link;
  link.beta = 1.0;
  link.contention = 2.5;
  EXPECT_DOUBLE_EQ(link.atSize(64e6).beta, 1.0);  // nothing measured out of cache
  link.cachedBytes = 1 << 20;
  link.largeBytes = 4 << 20;
  link.largeBeta = 3.0;
  link.largeContention = 1.5;
  EXPECT_DOUBLE_EQ(link.atSize(1 << 19).beta, 1.0);
  EXPECT_DOUBLE_EQ(link.atSize(1 << 19).contention, 2.5);
  EXPECT_DOUBLE_EQ(link.atSize(2 << 20).beta, 2.0);
  EXPECT_DOUBLE_EQ(link.atSize(2 << 20).contention, 2.0);
  EXPECT_DOUBLE_EQ(link.atSize(64 << 20).beta, 3.0);
  EXPECT_DOUBLE_EQ(link.atSize(64 << 20).contention, 1.5);
  EXPECT_DOUBLE_EQ(link.atSize(64 << 20).alpha, link.alpha);
}

// 3 ranks on 2 cores, with figures one init measured: a cached 1 MiB round
// 5.5x as slow with three ranks busy as with two, a 4 MiB one 1.75x. Out of
// cache the ring's extra busy rank costs less than halving's fold and
// unfold move (the ring measured 1.15-1.24x faster at 4 MiB).
// The probe's contention figure: batch by batch, so that one disturbed
// batch of either kind (here the pair's 3rd, 5x slow) does not move it.
TEST(LinkModel, ContentionIsTheMedianOfTheBatchRatios) {
  const std::vector<double> whole = {160, 150, 600, 170, 155};
  const std::vector<double> pair = {60, 65, 600, 70, 300};
  EXPECT_DOUBLE_EQ(medianRatio(whole, pair), 150.0 / 65);
  // An even count takes the mean of the middle two; the longer list's
  // extra entries have no partner and are left out.
  EXPECT_DOUBLE_EQ(medianRatio({2, 3, 4, 9}, {1, 1, 1}), 3.0);
  EXPECT_DOUBLE_EQ(medianRatio({2, 4}, {1, 1}), 3.0);
  EXPECT_DOUBLE_EQ(medianRatio({}, {}), 1.0);
  EXPECT_DOUBLE_EQ(medianRatio({5}, {0}), 1.0);
}

TEST(Selector, ThreeRanksOnTwoCoresTakeTheRingOutOfCache) {
  algo::LinkModel link;
  link.alpha = 2.24e-6;
  link.beta = 1.0 / 1.62e9;
  link.gamma = 1.0 / 14.6e9;
  link.coresPerHost = 2;
  link.ranksPerHost = 3;
  link.busyWhenMeasured = 3;
  link.contention = 5.54;
  algo::CollectiveArgs args;
  args.nranks = 3;
  args.count = (size_t{4} << 20) / 4;
  EXPECT_EQ(Selector({}, link).choose(args).name, "halving") << "cached figures only";
  link.cachedBytes = 1 << 20;
  link.largeBytes = 4 << 20;
  link.largeBeta = 1.0 / 1.62e9;
  link.largeContention = 1.75;
  Selector s({}, link);
  for (size_t bytes : {size_t{4} << 20, size_t{64} << 20}) {
    args.count = bytes / 4;
    EXPECT_EQ(s.choose(args).name, "ring") << bytes;
  }
  args.count = (size_t{1} << 20) / 4;
  EXPECT_EQ(s.choose(args).name, "halving");
}

TEST(Selector, ShortlistHoldsWhatTheModelPredictsWithinItsFactor) {
  algo::LinkModel link;
  link.alpha = 0.6e-6;
  link.beta = 1.0 / 17e9;
  link.gamma = 1.0 / 43e9;
  link.coresPerHost = 2;
  link.ranksPerHost = 4;
  Selector s({}, link);
  for (size_t bytes : {size_t{8}, size_t{1} << 15, size_t{1} << 24}) {
    algo::CollectiveArgs args;
    args.nranks = 4;
    args.count = bytes / 4;
    const auto list = s.shortlist(args);
    const algo::Algorithm& chosen = s.choose(args);
    const double best = chosen.estimate(args, link).seconds;
    EXPECT_NE(std::find(list.begin(), list.end(), &chosen), list.end()) << bytes;
    for (const auto& a : algo::allAlgorithms()) {
      if (a.kind != args.kind) continue;
      const bool listed = std::find(list.begin(), list.end(), &a) != list.end();
      EXPECT_EQ(listed, a.estimate(args, link).seconds <= best * Selector::kShortlistFactor)
          << a.name << " at " << bytes;
    }
  }
  // At 8 bytes the ring (6 rounds against butterfly's 2) is not worth a call.
  algo::CollectiveArgs small;
  small.nranks = 4;
  small.count = 2;
  for (const algo::Algorithm* a : s.shortlist(small)) EXPECT_NE(a->name, "ring");
  Selector forced({{"allreduce", "ring"}}, link);
  const auto only = forced.shortlist(small);
  ASSERT_EQ(only.size(), 1u);
  EXPECT_EQ(only[0]->name, "ring");
}

// The race behind a flaky abort test: when the call's own thread saw the
// abort flag before the aborting thread reached the connections, peers were
// told "communicator aborted" as misuse instead of losing rank 0.
TEST(Progress, PeersOfACallItsRankAbortedHearOfALostRank) {
  std::atomic<bool> aborted{true};
  Job job;
  job.rank = 3;
  job.aborted = &aborted;
  Status told = reasonForPeers(job, invalidUsage("braidAllReduce #1: communicator aborted"));
  EXPECT_EQ(told.code(), ErrorCode::kRemoteError);
  EXPECT_NE(told.message().find("rank 3 aborted"), std::string::npos) << told.message();
  aborted = false;
  Status mismatch = invalidUsage("braidAllReduce #2 count 5 on rank 3: rank 1 called count 6");
  EXPECT_EQ(reasonForPeers(job, mismatch).code(), ErrorCode::kInvalidUsage);
  EXPECT_EQ(reasonForPeers(job, mismatch).message(), mismatch.message());
}

}  // namespace
}  // namespace braid
