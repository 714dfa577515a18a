// The shared-memory board (src/board_collectives.h) on real processes: which
// calls it serves and which it leaves to the algorithms, exact results for
// every datatype and op, the same bits on every rank, and how its calls
// fail: mismatched calls on the board and across the board's edge, a peer
// that dies, an abort, and a peer that comes late enough for the waiting
// rank to sleep.
#include <gtest/gtest.h>
#include <sched.h>
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
      // Within the header line, one past it, and the default slot's 4 KiB.
      for (size_t count : {size_t{1}, 3 / es + 1, 48 / es, 64 / es, 4096 / es}) {
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
  // Past the default slot (BRAID_SHM_BOARD_BYTES 8192 holds 8240 bytes):
  // through the algorithms.
  std::vector<float> big(8240 / 4 + 1, 1.f);
  RANK_ASSERT_OK(braidAllReduce(big.data(), big.data(), big.size(), braidFloat32, braidSum,
                                ctx.comm, nullptr));
  RANK_EXPECT_TRUE(lastAllReduce(ctx.comm) != "board") << lastAllReduce(ctx.comm);
  RANK_EXPECT_EQ(big.back(), static_cast<float>(ctx.nranks));
}

TEST(Board, ServesAllReduceOfEveryTypeAndOpAndBarrier) {
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE("nranks " + std::to_string(n));
    runRanks(n, everyTypeAndOp, kTimeout);
  }
}

// Every collective with every rank's send buffer in a slot, and one element
// past it: exact results either way, on the board only where it fits, and
// for Broadcast, Reduce, Gather and Scatter only where every rank has a
// core of its own (as the library decides, from the ranks' affinity).
constexpr size_t kSlotBytes = 1008;  // BRAID_SHM_BOARD_BYTES=1008: 16 + 1008 is 16 lines
constexpr int kRoot = 1;

int32_t valueOf(int rank, size_t i) {
  return rank * 100000 + static_cast<int32_t>(i);
}

int coresOfThisProcess() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

std::string lastAlgorithm(braidComm_t comm, const char* collective) {
  const char* name = nullptr;
  if (braidCommGetLastAlgorithm(comm, collective, &name) != braidSuccess || !name) return "?";
  return name;
}

struct KindCase {
  const char* name;  // BRAID_ALGO's spelling
  size_t blocks;     // of `count` elements in the largest send buffer
  bool rooted;
  bool reduces;
};

// Runs `kind` with `count` elements (the ABI's count), out of place or in
// place, and checks every element this rank receives.
void runKind(RankContext& ctx, const KindCase& kind, size_t count, bool inPlace) {
  const int n = ctx.nranks, me = ctx.rank;
  const size_t total = count * n;
  std::vector<int32_t> send(total), recv(total, -7);
  for (size_t i = 0; i < total; ++i) send[i] = valueOf(me, i);
  auto sumOver = [&](size_t i) {
    int32_t s = 0;
    for (int r = 0; r < n; ++r) s += valueOf(r, i);
    return s;
  };
  const std::string what =
      std::string(kind.name) + " count " + std::to_string(count) + (inPlace ? " in place" : "");
  ctx.step(what);
  braidComm_t c = ctx.comm;
  const std::string k = kind.name;
  int32_t* out = recv.data();
  if (k == "allreduce") {
    const int32_t* in = inPlace ? out : send.data();
    if (inPlace) std::copy_n(send.data(), count, out);
    RANK_ASSERT_OK(braidAllReduce(in, out, count, braidInt32, braidSum, c, nullptr));
    for (size_t i = 0; i < count; ++i) RANK_ASSERT_EQ(out[i], sumOver(i)) << what << " " << i;
  } else if (k == "broadcast") {
    if (inPlace && me == kRoot) std::copy_n(send.data(), count, out);
    RANK_ASSERT_OK(
        braidBroadcast(inPlace ? out : send.data(), out, count, braidInt32, kRoot, c, nullptr));
    for (size_t i = 0; i < count; ++i)
      RANK_ASSERT_EQ(out[i], valueOf(kRoot, i)) << what << " " << i;
  } else if (k == "reduce") {
    if (inPlace) std::copy_n(send.data(), count, out);
    RANK_ASSERT_OK(braidReduce(inPlace ? out : send.data(), out, count, braidInt32, braidSum, kRoot,
                               c, nullptr));
    if (me == kRoot) {
      for (size_t i = 0; i < count; ++i) RANK_ASSERT_EQ(out[i], sumOver(i)) << what << " " << i;
    }
  } else if (k == "allgather") {
    int32_t* mine = out + me * count;
    if (inPlace) std::copy_n(send.data(), count, mine);
    RANK_ASSERT_OK(
        braidAllGather(inPlace ? mine : send.data(), out, count, braidInt32, c, nullptr));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        RANK_ASSERT_EQ(out[r * count + i], valueOf(r, i)) << what << " from " << r;
  } else if (k == "reducescatter") {
    int32_t* buffer = inPlace ? send.data() : out;
    RANK_ASSERT_OK(braidReduceScatter(send.data(), inPlace ? buffer + me * count : out, count,
                                      braidInt32, braidSum, c, nullptr));
    const int32_t* got = inPlace ? buffer + me * count : out;
    for (size_t i = 0; i < count; ++i)
      RANK_ASSERT_EQ(got[i], sumOver(me * count + i)) << what << " " << i;
  } else if (k == "alltoall") {
    RANK_ASSERT_OK(braidAllToAll(send.data(), out, count, braidInt32, c, nullptr));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        RANK_ASSERT_EQ(out[r * count + i], valueOf(r, me * count + i)) << what << " from " << r;
  } else if (k == "gather") {
    int32_t* mine = out + me * count;
    if (inPlace && me == kRoot) std::copy_n(send.data(), count, mine);
    RANK_ASSERT_OK(braidGather(inPlace && me == kRoot ? mine : send.data(), out, count, braidInt32,
                               kRoot, c, nullptr));
    if (me == kRoot) {
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i)
          RANK_ASSERT_EQ(out[r * count + i], valueOf(r, i)) << what << " from " << r;
    }
  } else if (k == "scatter") {
    int32_t* got = inPlace && me == kRoot ? send.data() + me * count : out;
    RANK_ASSERT_OK(braidScatter(send.data(), got, count, braidInt32, kRoot, c, nullptr));
    for (size_t i = 0; i < count; ++i)
      RANK_ASSERT_EQ(got[i], valueOf(kRoot, me * count + i)) << what << " " << i;
  }
}

TEST(Board, ServesEveryCollectiveThatFitsASlot) {
  const KindCase kinds[] = {
      {"allreduce", 1, false, true},     {"broadcast", 1, true, false},
      {"reduce", 1, true, true},         {"allgather", 1, false, false},
      {"reducescatter", 0, false, true}, {"alltoall", 0, false, false},
      {"gather", 1, true, false},        {"scatter", 0, true, false},
  };
  RunOptions options;
  options.env = {{"BRAID_SHM_BOARD_BYTES", std::to_string(kSlotBytes)}};
  const int cores = coresOfThisProcess();
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE("nranks " + std::to_string(n));
    runRanks(
        n,
        [&](RankContext& ctx) {
          for (const KindCase& kind : kinds) {
            const size_t blocks = kind.blocks ? kind.blocks : static_cast<size_t>(n);
            const size_t fits = kSlotBytes / sizeof(int32_t) / blocks;
            const bool boardTakesIt = !kind.rooted || n <= cores;
            for (size_t count : {size_t{1}, fits, fits + 1})
              for (bool inPlace : {false, true}) {
                if (inPlace && std::string(kind.name) == "alltoall") continue;
                runKind(ctx, kind, count, inPlace);
                const bool onBoard = lastAlgorithm(ctx.comm, kind.name) == "board";
                RANK_EXPECT_EQ(onBoard, boardTakesIt && count <= fits)
                    << kind.name << " count " << count << " on " << cores
                    << " cores: " << lastAlgorithm(ctx.comm, kind.name);
              }
          }
        },
        kTimeout, options);
  }
}

// A board AllReduce reads every rank's slot: beyond 32 KiB read in all, the
// algorithms take it, however large the slots.
TEST(Board, AllReduceThatWouldReadTooMuchGoesThroughTheAlgorithms) {
  RunOptions options;
  options.env = {{"BRAID_SHM_BOARD_BYTES", "65536"}};
  runRanks(
      4,
      [](RankContext& ctx) {
        for (size_t bytes : {size_t{8192}, size_t{8192 + 4}}) {
          std::vector<int32_t> v(bytes / 4, ctx.rank + 1);
          RANK_ASSERT_OK(braidAllReduce(v.data(), v.data(), v.size(), braidInt32, braidSum,
                                        ctx.comm, nullptr));
          RANK_EXPECT_EQ(v.back(), 10);
          RANK_EXPECT_EQ(lastAllReduce(ctx.comm) == "board", bytes * 4 <= 32768)
              << bytes << " bytes: " << lastAllReduce(ctx.comm);
        }
        // AllGather reads what any algorithm delivers: the slot bounds it alone.
        std::vector<int32_t> block(16000 / 4, ctx.rank), all(4 * block.size());
        RANK_ASSERT_OK(
            braidAllGather(block.data(), all.data(), block.size(), braidInt32, ctx.comm, nullptr));
        RANK_EXPECT_EQ(all.back(), 3);
        RANK_EXPECT_EQ(lastAlgorithm(ctx.comm, "allgather"), std::string("board"));
      },
      kTimeout, options);
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

TEST(Board, GroupsGoThroughTheAlgorithms) {
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
        // Board and algorithm calls interleave on the caller's thread.
        std::vector<double> v(100, 1.0);
        for (int i = 0; i < 50; ++i) {
          RANK_ASSERT_OK(braidAllReduce(&x, &y, 1, braidInt32, braidSum, ctx.comm, nullptr));
          RANK_ASSERT_OK(
              braidAllReduce(v.data(), v.data(), 100, braidFloat64, braidMax, ctx.comm, nullptr));
        }
        RANK_EXPECT_EQ(y, 4);
      },
      kTimeout);
}

// The caller's thread and the first three streams have lanes of the board
// (Communicator::kBoardStreams); a fourth stream's calls go through the
// algorithms. Calls on two streams and on the caller's thread run at once,
// each lane in its own order, and every result is exact.
TEST(Board, TheFirstStreamsHaveLanesOfTheirOwn) {
  for (int ranks : {2, 3}) {
    SCOPED_TRACE("nranks " + std::to_string(ranks));
    runRanks(
        ranks,
        [](RankContext& ctx) {
          const int n = ctx.nranks;
          std::vector<braidStream_t> streams(4, nullptr);
          for (auto& s : streams) RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &s));
          for (size_t i = 0; i < streams.size(); ++i) {
            int32_t x = ctx.rank + 1;
            RANK_ASSERT_OK(braidAllReduce(&x, &x, 1, braidInt32, braidSum, ctx.comm, streams[i]));
            RANK_ASSERT_OK(braidStreamSynchronize(streams[i]));
            RANK_EXPECT_EQ(x, n * (n + 1) / 2);
            RANK_EXPECT_EQ(lastAllReduce(ctx.comm) == "board", i < 3)
                << "stream " << i + 1 << ": " << lastAllReduce(ctx.comm);
          }
          constexpr int kCalls = 300;
          std::vector<int64_t> sums(kCalls);
          std::vector<int32_t> gathered(static_cast<size_t>(kCalls) * n);
          std::vector<int32_t> mine(kCalls);
          std::thread reducer([&] {
            for (int i = 0; i < kCalls; ++i) {
              sums[i] = int64_t{1000} * i + ctx.rank;
              if (braidAllReduce(&sums[i], &sums[i], 1, braidInt64, braidSum, ctx.comm,
                                 streams[0]) != braidSuccess)
                return;
            }
          });
          std::thread gatherer([&] {
            for (int i = 0; i < kCalls; ++i) {
              mine[i] = 7 * i + ctx.rank;
              if (braidAllGather(&mine[i], &gathered[static_cast<size_t>(i) * n], 1, braidInt32,
                                 ctx.comm, streams[1]) != braidSuccess)
                return;
            }
          });
          for (int i = 0; i < kCalls; ++i) {
            int32_t x = i;
            RANK_ASSERT_OK(braidAllReduce(&x, &x, 1, braidInt32, braidMax, ctx.comm, nullptr));
            RANK_EXPECT_EQ(x, i);
          }
          reducer.join();
          gatherer.join();
          RANK_ASSERT_OK(braidStreamSynchronize(streams[0]));
          RANK_ASSERT_OK(braidStreamSynchronize(streams[1]));
          for (int i = 0; i < kCalls; ++i) {
            RANK_ASSERT_EQ(sums[i], int64_t{1000} * i * n + n * (n - 1) / 2) << "call " << i;
            for (int r = 0; r < n; ++r)
              RANK_ASSERT_EQ(gathered[static_cast<size_t>(i) * n + r], 7 * i + r)
                  << "call " << i << ", rank " << r;
          }
          for (auto s : streams) RANK_ASSERT_OK(braidStreamDestroy(s));
        },
        kTimeout);
  }
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
    // The wider calls the board now serves: every rank compares every
    // rank's call, so two roots are caught in the call itself.
    expectMismatch(n, "Broadcast roots",
                   [](RankContext& c, bool z) {
                     return braidBroadcast(a, a, 2, braidFloat32, z ? 0 : 1, c.comm, nullptr);
                   },
                   {"mismatched", "root"});
    expectMismatch(n, "AllGather count",
                   [](RankContext& c, bool z) {
                     return braidAllGather(a, b, z ? 1 : 2, braidFloat32, c.comm, nullptr);
                   },
                   {"mismatched", "count=1", "count=2"});
  }
}

// On a stream's lane as on the caller's thread: the ranks' calls compared,
// the error from braidStreamSynchronize.
TEST(Board, MismatchedCallsOnAStreamReturnInvalidUsage) {
  static float a[16], b[16];
  expectMismatch(2, "count on a stream",
                 [](RankContext& c, bool z) {
                   braidStream_t s = nullptr;
                   braidResult_t r = braidStreamCreate(c.comm, &s);
                   if (r != braidSuccess) return r;
                   r = braidAllReduce(a, b, z ? 2 : 3, braidFloat32, braidSum, c.comm, s);
                   if (r == braidSuccess) r = braidStreamSynchronize(s);
                   // A success leaves the last error (synchronize's) as it is.
                   (void)braidStreamDestroy(s);
                   return r;
                 },
                 {"mismatched", "count=2", "count=3"});
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
