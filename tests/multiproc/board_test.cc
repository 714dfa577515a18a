// The shared-memory board (src/board_collectives.h) on real processes: which
// calls it serves and which it leaves to the algorithms, exact results for
// every datatype and op, the same bits on every rank, and how its calls
// fail: mismatched calls on the board and across the board's edge, a peer
// that dies, an abort, and a peer that comes late enough for the waiting
// rank to sleep.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "reference.h"

namespace braidtest {
namespace {

constexpr std::chrono::seconds kTimeout{120};

std::string lastAllReduce(braidComm_t comm) {
  const char* name = nullptr;
  if (braidCommGetLastAlgorithm(comm, "allreduce", &name) != braidSuccess || !name) return "?";
  return name;
}

void everyTypeAndOp(RankContext& ctx) {
  const uint64_t seed = 11;
  for (braidDataType_t t : kAllTypes)
    for (braidRedOp_t op : kAllOps) {
      const size_t es = typeInfo(t).size;
      for (size_t count : {size_t{1}, 3 / es + 1, 48 / es}) {
        std::vector<uint8_t> in(count * es), out(count * es, 0xee), all(ctx.nranks * count * es);
        fillInput(t, kindOf(op), seed, ctx.rank, in.data(), count);
        ctx.step(std::string("AllReduce ") + typeInfo(t).name + " " + opName(op));
        RANK_ASSERT_OK(braidAllReduce(in.data(), out.data(), count, t, op, ctx.comm, nullptr));
        RANK_EXPECT_EQ(lastAllReduce(ctx.comm), std::string("board"))
            << count * es << " bytes of " << typeInfo(t).name;
        std::string wrong = compareWith(
            t, out.data(), count, [&](size_t i) { return reduceAt(t, op, seed, ctx.nranks, i); });
        RANK_EXPECT_TRUE(wrong.empty())
            << typeInfo(t).name << " " << opName(op) << " count " << count << ": " << wrong;
        // Every rank holds the same bits (Avg of floats is inexact, but alike).
        RANK_ASSERT_OK(
            braidAllGather(out.data(), all.data(), count * es, braidUint8, ctx.comm, nullptr));
        for (int r = 0; r < ctx.nranks; ++r)
          RANK_EXPECT_EQ(std::memcmp(all.data() + r * count * es, out.data(), count * es), 0)
              << "rank " << r << " differs, " << typeInfo(t).name << " " << opName(op);
        // In place too.
        RANK_ASSERT_OK(braidAllReduce(in.data(), in.data(), count, t, op, ctx.comm, nullptr));
        RANK_EXPECT_EQ(std::memcmp(in.data(), out.data(), count * es), 0) << "in place";
      }
    }
  RANK_ASSERT_OK(braidBarrier(ctx.comm, nullptr));
  const char* name = nullptr;
  RANK_ASSERT_OK(braidCommGetLastAlgorithm(ctx.comm, "barrier", &name));
  RANK_EXPECT_EQ(std::string(name), std::string("board"));
  // One byte past a slot goes through the algorithms.
  std::vector<float> big(13, 1.f);
  RANK_ASSERT_OK(braidAllReduce(big.data(), big.data(), big.size(), braidFloat32, braidSum,
                                ctx.comm, nullptr));
  RANK_EXPECT_TRUE(lastAllReduce(ctx.comm) != "board") << lastAllReduce(ctx.comm);
  RANK_EXPECT_EQ(big[12], static_cast<float>(ctx.nranks));
}

TEST(Board, ServesTinyAllReduceOfEveryTypeAndOpAndBarrier) {
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE("nranks " + std::to_string(n));
    runRanks(n, everyTypeAndOp, kTimeout);
  }
}

void expectAlgorithm(const RunOptions& options, const std::string& expected, bool board) {
  runRanks(
      2,
      [&](RankContext& ctx) {
        int32_t x = ctx.rank + 1;
        RANK_ASSERT_OK(braidAllReduce(&x, &x, 1, braidInt32, braidSum, ctx.comm, nullptr));
        RANK_EXPECT_EQ(x, 3);
        const std::string used = lastAllReduce(ctx.comm);
        if (board)
          RANK_EXPECT_EQ(used, expected);
        else
          RANK_EXPECT_TRUE(used != "board" && (expected.empty() || used == expected)) << used;
      },
      kTimeout, options);
}

TEST(Board, NotUsedWhenForcedTurnedOffOrOverTcp) {
  RunOptions forced;
  forced.env = {{"BRAID_ALGO", "allreduce=ring"}};
  expectAlgorithm(forced, "ring", false);
  RunOptions off;
  off.env = {{"BRAID_SHM_BOARD", "0"}};
  expectAlgorithm(off, "", false);
  RunOptions tcp;
  tcp.env = {{"BRAID_TRANSPORT", "tcp"}};
  expectAlgorithm(tcp, "", false);
  RunOptions on;
  on.env = {{"BRAID_SHM_BOARD", "1"}};
  expectAlgorithm(on, "board", true);
}

TEST(Board, GroupsAndStreamsGoThroughTheAlgorithms) {
  runRanks(
      2,
      [](RankContext& ctx) {
        int32_t x = 1, y = 2;
        RANK_ASSERT_OK(braidGroupStart());
        RANK_ASSERT_OK(braidAllReduce(&x, &x, 1, braidInt32, braidSum, ctx.comm, nullptr));
        RANK_ASSERT_OK(braidAllReduce(&y, &y, 1, braidInt32, braidSum, ctx.comm, nullptr));
        RANK_ASSERT_OK(braidGroupEnd());
        RANK_EXPECT_EQ(x, 2);
        RANK_EXPECT_EQ(y, 4);
        RANK_EXPECT_TRUE(lastAllReduce(ctx.comm) != "board");
        braidStream_t s = nullptr;
        RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &s));
        RANK_ASSERT_OK(braidAllReduce(&x, &x, 1, braidInt32, braidSum, ctx.comm, s));
        RANK_ASSERT_OK(braidStreamSynchronize(s));
        RANK_EXPECT_EQ(x, 4);
        RANK_EXPECT_TRUE(lastAllReduce(ctx.comm) != "board");
        RANK_ASSERT_OK(braidStreamDestroy(s));
        // Board and algorithm calls interleave on the caller's thread.
        std::vector<double> v(100, 1.0);
        for (int i = 0; i < 50; ++i) {
          RANK_ASSERT_OK(braidAllReduce(&x, &y, 1, braidInt32, braidSum, ctx.comm, nullptr));
          RANK_ASSERT_OK(
              braidAllReduce(v.data(), v.data(), 100, braidFloat64, braidMax, ctx.comm, nullptr));
        }
        RANK_EXPECT_EQ(y, 8);
      },
      kTimeout);
}

// `call` makes rank 0 and the others call different things; every rank must
// get braidInvalidUsage from it or from one of the next two Barriers.
void expectMismatch(int nranks, const char* what,
                    std::function<braidResult_t(RankContext&, bool)> call,
                    std::vector<std::string> words) {
  SCOPED_TRACE(what);
  RunOptions options;
  options.braidTimeoutSeconds = 20;
  auto result = runRanks(
      nranks,
      [&](RankContext& ctx) {
        const auto start = std::chrono::steady_clock::now();
        braidResult_t r = call(ctx, ctx.rank == 0);
        std::string msg = braidGetLastError(nullptr);
        for (int next = 0; next < 2 && r == braidSuccess; ++next) {
          r = braidBarrier(ctx.comm, nullptr);
          msg = braidGetLastError(nullptr);
        }
        RANK_EXPECT_EQ(r, braidInvalidUsage) << what << ": " << msg;
        RANK_EXPECT_TRUE(secondsSince(start) < 10) << "found only by the timeout: " << msg;
        for (const auto& w : words)
          RANK_EXPECT_TRUE(mentions(msg, w)) << "\"" << msg << "\" does not mention " << w;
        ::usleep(300000);
      },
      kTimeout, options);
  (void)result;
}

TEST(Board, MismatchedCallsReturnInvalidUsage) {
  static float a[16], b[16];
  for (int n : {2, 3}) {
    SCOPED_TRACE("nranks " + std::to_string(n));
    // Both on the board.
    expectMismatch(n, "count",
                   [](RankContext& c, bool z) {
                     return braidAllReduce(a, b, z ? 2 : 3, braidFloat32, braidSum, c.comm,
                                           nullptr);
                   },
                   {"mismatched", "count=2", "count=3"});
    expectMismatch(n, "op",
                   [](RankContext& c, bool z) {
                     return braidAllReduce(a, b, 2, braidFloat32, z ? braidSum : braidMin, c.comm,
                                           nullptr);
                   },
                   {"mismatched", "sum", "min"});
    // One side on the board, the other through the algorithms.
    expectMismatch(n, "board against algorithm",
                   [](RankContext& c, bool z) {
                     return z ? braidAllReduce(a, b, 2, braidFloat32, braidSum, c.comm, nullptr)
                              : braidAllReduce(a, b, 16, braidFloat32, braidSum, c.comm, nullptr);
                   },
                   {"mismatched"});
    expectMismatch(n, "AllReduce against Broadcast",
                   [](RankContext& c, bool z) {
                     return z ? braidAllReduce(a, b, 2, braidFloat32, braidSum, c.comm, nullptr)
                              : braidBroadcast(a, b, 2, braidFloat32, 1, c.comm, nullptr);
                   },
                   {"mismatched"});
  }
}

TEST(Board, DeadPeerGivesRemoteError) {
  runRanks(
      3,
      [](RankContext& ctx) {
        if (ctx.rank == 2) {
          ctx.step("exiting without braidCommDestroy");
          ::_exit(0);
        }
        const auto start = std::chrono::steady_clock::now();
        int32_t x = 1;
        braidResult_t r = braidAllReduce(&x, &x, 1, braidInt32, braidSum, ctx.comm, nullptr);
        RANK_EXPECT_EQ(r, braidRemoteError) << braidGetLastError(nullptr);
        RANK_EXPECT_TRUE(secondsSince(start) < 10) << braidGetLastError(nullptr);
      },
      kTimeout);
}

TEST(Board, AbortEndsAWaitingCall) {
  runRanks(
      2,
      [](RankContext& ctx) {
        int32_t x = 1;
        if (ctx.rank == 1) {
          ::usleep(1500000);  // rank 0 aborted meanwhile
          (void)braidAllReduce(&x, &x, 1, braidInt32, braidSum, ctx.comm, nullptr);
          return;
        }
        std::thread aborter([&] {
          ::usleep(300000);
          RANK_EXPECT_OK(braidCommAbort(ctx.comm));
        });
        const auto start = std::chrono::steady_clock::now();
        braidResult_t r = braidAllReduce(&x, &x, 1, braidInt32, braidSum, ctx.comm, nullptr);
        const double s = secondsSince(start);
        std::string msg = braidGetLastError(nullptr);
        aborter.join();
        RANK_EXPECT_EQ(r, braidInvalidUsage) << msg;
        RANK_EXPECT_TRUE(mentions(msg, "aborted")) << msg;
        RANK_EXPECT_TRUE(s < 1.2) << "the aborted call returned after " << s << " s";
      },
      kTimeout);
}

TEST(Board, ALatePeerWakesTheSleepingRank) {
  runRanks(
      2,
      [](RankContext& ctx) {
        for (int round = 0; round < 5; ++round) {
          // Well past the spinning: rank 0 sleeps on the board meanwhile.
          if (ctx.rank == 1) ::usleep(50000);
          int64_t x = ctx.rank + round;
          const auto start = std::chrono::steady_clock::now();
          RANK_ASSERT_OK(braidAllReduce(&x, &x, 1, braidInt64, braidSum, ctx.comm, nullptr));
          RANK_EXPECT_EQ(x, 1 + 2 * round);
          if (ctx.rank == 0) {
            RANK_EXPECT_TRUE(secondsSince(start) < 1.0);
          }
        }
      },
      kTimeout);
}

TEST(Board, StalledPeerGivesTimeout) {
  RunOptions options;
  options.braidTimeoutSeconds = 1;
  runRanks(
      2,
      [](RankContext& ctx) {
        int32_t x = 1;
        if (ctx.rank == 1) {
          ::usleep(2500000);
          (void)braidAllReduce(&x, &x, 1, braidInt32, braidSum, ctx.comm, nullptr);
          return;
        }
        const auto start = std::chrono::steady_clock::now();
        braidResult_t r = braidAllReduce(&x, &x, 1, braidInt32, braidSum, ctx.comm, nullptr);
        const double s = secondsSince(start);
        std::string msg = braidGetLastError(nullptr);
        RANK_EXPECT_EQ(r, braidTimeout) << msg;
        RANK_EXPECT_TRUE(s > 0.9 && s < 2.0) << s << " s";
        RANK_EXPECT_TRUE(mentions(msg, "rank 1")) << msg;
        RANK_EXPECT_TRUE(mentions(msg, "BRAID_TIMEOUT")) << msg;
      },
      kTimeout, options);
}

}  // namespace
}  // namespace braidtest
