// The online tuner's walk: warm-up with the model's choice, every candidate
// timed in blocks of calls, in turn, then the agreed fastest kept for good.
#include "src/online_tuner.h"

#include <gtest/gtest.h>

namespace braid {
namespace {

std::vector<const algo::Algorithm*> allReduceAlgorithms() {
  std::vector<const algo::Algorithm*> out;
  for (const auto& a : algo::allAlgorithms())
    if (a.kind == algo::CollectiveKind::kAllReduce) out.push_back(&a);
  return out;
}

algo::CollectiveArgs args(size_t count) {
  algo::CollectiveArgs a;
  a.count = count;
  a.nranks = 4;
  return a;
}

TEST(OnlineTuner, WarmsUpTriesEveryCandidateInBlocksThenKeepsTheFastest) {
  OnlineTuner tuner;
  const auto candidates = allReduceAlgorithms();
  ASSERT_GE(candidates.size(), 2u);
  const auto key = OnlineTuner::keyFor(0, args(1000));
  const algo::Algorithm* model = candidates.back();
  auto first = tuner.next(key, candidates, model);
  EXPECT_EQ(first.algorithm, model);
  EXPECT_EQ(first.trial, -1) << "the first call warms up, untimed";
  bool complete = false;
  std::vector<int> timedCalls(candidates.size(), 0);
  for (int round = 0; round < OnlineTuner::kRounds; ++round)
    for (size_t i = 0; i < candidates.size(); ++i)
      for (int call = 0; call < OnlineTuner::kBlockCalls; ++call) {
        ASSERT_FALSE(complete);
        auto c = tuner.next(key, candidates, model);
        EXPECT_EQ(c.algorithm, candidates[i]) << "round " << round << " call " << call;
        if (call == 0) {
          EXPECT_EQ(c.trial, -1) << "a block's first call settles the ranks, untimed";
          continue;
        }
        ASSERT_EQ(c.trial, static_cast<int>(i));
        // Candidate 1 runs at 1.0 but for one preempted call; candidate 0
        // at 5.0 but for one lucky call faster than anything else.
        const int n = timedCalls[i]++;
        double seconds = i == 1 ? (n == 0 ? 100.0 : 1.0) : (i == 0 && n == 0 ? 0.1 : 5.0);
        complete = tuner.record(key, c.trial, seconds);
      }
  ASSERT_TRUE(complete);
  for (int n : timedCalls) EXPECT_EQ(n, OnlineTuner::kRounds * (OnlineTuner::kBlockCalls - 1));
  std::vector<double> times = tuner.times(key);
  EXPECT_EQ(times[1], 1.0) << "the median, not the preempted call";
  EXPECT_EQ(times[0], 5.0) << "the median, not the lucky call";
  EXPECT_EQ(tuner.decide(key, times), candidates[1]);
  for (int i = 0; i < 3; ++i) {
    auto c = tuner.next(key, candidates, model);
    EXPECT_EQ(c.algorithm, candidates[1]);
    EXPECT_EQ(c.trial, -1);
  }
}

// Runs every trial call of `key`, each timed call taking one second.
void runTrials(OnlineTuner& tuner, const OnlineTuner::Key& key,
               const std::vector<const algo::Algorithm*>& candidates,
               const algo::Algorithm* model) {
  (void)tuner.next(key, candidates, model);
  for (int call = 0; call < OnlineTuner::trialCalls(candidates.size()); ++call) {
    auto c = tuner.next(key, candidates, model);
    if (c.trial >= 0) (void)tuner.record(key, c.trial, 1.0);
  }
}

TEST(OnlineTuner, AgreedTimesDecideNotTheLocalOnes) {
  OnlineTuner tuner;
  const auto candidates = allReduceAlgorithms();
  const auto key = OnlineTuner::keyFor(0, args(1 << 20));
  runTrials(tuner, key, candidates, candidates[0]);
  std::vector<double> agreed(candidates.size(), 3.0);
  agreed[2] = 0.5;  // another rank saw candidate 2 win
  EXPECT_EQ(tuner.decide(key, agreed), candidates[2]);
}

// A candidate faster than the model's choice by less than kMargin is noise
// of a few calls; by more, it wins.
TEST(OnlineTuner, TheModelsChoiceStaysUnlessBeatenByMoreThanTheMargin) {
  const auto candidates = allReduceAlgorithms();
  ASSERT_GE(candidates.size(), 3u);
  const algo::Algorithm* model = candidates[2];
  for (double faster :
       {1.0 / (1 + OnlineTuner::kMargin / 2), 1.0 / (1 + 2 * OnlineTuner::kMargin)}) {
    OnlineTuner tuner;
    const auto key = OnlineTuner::keyFor(0, args(4096));
    runTrials(tuner, key, candidates, model);
    std::vector<double> agreed(candidates.size(), 1.0);
    agreed[0] = faster;
    const bool beaten = faster < 1.0 / (1 + OnlineTuner::kMargin);
    EXPECT_EQ(tuner.decide(key, agreed), beaten ? candidates[0] : model) << faster;
  }
}

// Only what the model shortlists is timed: a single candidate is kept at
// once, untimed.
TEST(OnlineTuner, ASingleCandidateIsKeptWithoutTrials) {
  OnlineTuner tuner;
  const auto all = allReduceAlgorithms();
  const std::vector<const algo::Algorithm*> one{all[1]};
  const auto key = OnlineTuner::keyFor(0, args(8));
  for (int call = 0; call < 3; ++call) {
    auto c = tuner.next(key, one, all[1]);
    EXPECT_EQ(c.algorithm, all[1]);
    EXPECT_EQ(c.trial, -1);
  }
  EXPECT_TRUE(tuner.knows(key));
  EXPECT_EQ(tuner.candidates(key), one);
}

TEST(OnlineTuner, SizeClassesStreamsAndCollectivesAreApart) {
  EXPECT_EQ(OnlineTuner::keyFor(0, args(256)), OnlineTuner::keyFor(0, args(511)));
  EXPECT_NE(OnlineTuner::keyFor(0, args(256)), OnlineTuner::keyFor(0, args(512)));
  EXPECT_NE(OnlineTuner::keyFor(0, args(256)), OnlineTuner::keyFor(1, args(256)));
  auto b = args(256);
  b.kind = algo::CollectiveKind::kBroadcast;
  EXPECT_NE(OnlineTuner::keyFor(0, args(256)), OnlineTuner::keyFor(0, b));
  EXPECT_EQ(OnlineTuner::keyFor(0, args(0)).sizeClass, -1);
}

}  // namespace
}  // namespace braid
