// The online tuner on real processes: while it tries algorithms every
// result is right, and once it has decided every rank uses the same one,
// on the caller's thread and on a stream alike.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

namespace braidtest {
namespace {

constexpr std::chrono::seconds kTimeout{120};

void tuneAndAgree(RankContext& ctx, braidStream_t stream) {
  const std::vector<size_t> counts = {10, 3000, 70000};
  for (size_t count : counts) {
    std::vector<float> x(count);
    // Past the trials: 1 warm-up + 3 rounds x 3 calls x 4 algorithms (OnlineTuner).
    for (int call = 0; call < 40; ++call) {
      for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(ctx.rank + 1 + (i % 5));
      RANK_ASSERT_OK(
          braidAllReduce(x.data(), x.data(), count, braidFloat32, braidSum, ctx.comm, stream));
      if (stream) {
        RANK_ASSERT_OK(braidStreamSynchronize(stream));
      }
      const float base = static_cast<float>(ctx.nranks * (ctx.nranks + 1) / 2);
      for (size_t i = 0; i < count; i += 97) {
        RANK_ASSERT_EQ(x[i], base + static_cast<float>(ctx.nranks * (i % 5)))
            << "count " << count << " call " << call;
      }
    }
    const char* name = nullptr;
    RANK_ASSERT_OK(braidCommGetLastAlgorithm(ctx.comm, "allreduce", &name));
    char mine[32] = {}, all[8][32] = {};
    std::strncpy(mine, name, sizeof mine - 1);
    RANK_ASSERT_OK(braidAllGather(mine, all, sizeof mine, braidUint8, ctx.comm, nullptr));
    for (int r = 0; r < ctx.nranks; ++r)
      RANK_EXPECT_EQ(std::string(all[r]), std::string(mine)) << "count " << count;
  }
}

TEST(Tuner, RanksAgreeOnTheMeasuredChoice) {
  RunOptions options;
  options.env = {{"BRAID_TUNE", "measure"}};
  for (int n : {2, 3, 5}) {
    runRanks(
        n, [](RankContext& ctx) { tuneAndAgree(ctx, nullptr); }, kTimeout, options);
    runRanks(
        n,
        [](RankContext& ctx) {
          braidStream_t stream = nullptr;
          RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &stream));
          tuneAndAgree(ctx, stream);
          RANK_ASSERT_OK(braidStreamDestroy(stream));
        },
        kTimeout, options);
  }
}

}  // namespace
}  // namespace braidtest
