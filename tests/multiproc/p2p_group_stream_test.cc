// Point-to-point calls in groups and host streams on real processes, the
// same bodies again with BRAID_DEBUG=TRACE, what ranks see when calls
// mismatch or a peer dies, aborts or stalls, and communicators made from
// launcher variables.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "reference.h"

namespace braidtest {
namespace {

constexpr std::chrono::seconds kTimeout{120};
// An AllReduce of this many floats (8 KiB) is past the shared-memory board's
// slot (BRAID_SHM_BOARD_BYTES), so it runs as messages through the engine,
// whose failures and diagnostics these tests look at; the board's own are
// in board_test.cc.
constexpr size_t kEngineFloats = 2048;

std::string where(const char* what, braidDataType_t t, size_t count, int n) {
  return std::string(what) + " " + typeInfo(t).name + " count=" + std::to_string(count) +
         " nranks=" + std::to_string(n);
}

void expectCopy(const std::string& desc, braidDataType_t t, const void* got, size_t count,
                uint64_t seed, int fromRank, size_t firstIndex = 0) {
  std::string m = compareWith(t, got, count, [&](size_t i) {
    return Expected{inputValue(t, Kind::kCopy, seed, fromRank, firstIndex + i), 0};
  });
  RANK_EXPECT_TRUE(m.empty()) << desc << ": " << m;
}

// Every rank sends to rank+1 and receives from rank-1 inside one group (a
// self-send when nranks == 1), then both ways at once, then a full exchange
// of Send/Recv pairs, then blocking pairs outside a group.
void ringBody(RankContext& ctx) {
  int n = ctx.nranks, me = ctx.rank, next = (me + 1) % n, prev = (me + n - 1) % n;
  uint64_t seed = 1000;
  for (braidDataType_t t : {braidInt8, braidFloat16, braidFloat32, braidInt64, braidFloat64}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{65537}}) {
      std::string desc = where("ring", t, count, n);
      ctx.step(desc);
      ++seed;
      GuardedBuffer send(t, count), recv(t, count);
      fillInput(t, Kind::kCopy, seed, me, send.data(), count);
      auto orig = send.snapshot();
      RANK_ASSERT_OK(braidGroupStart());
      RANK_ASSERT_OK(braidSend(send.data(), count, t, next, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidRecv(recv.data(), count, t, prev, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidGroupEnd()) << desc;
      expectCopy(desc, t, recv.data(), count, seed, prev);
      RANK_EXPECT_TRUE(send.equals(orig)) << desc << ": sendbuff modified";
      RANK_EXPECT_TRUE(send.guardsIntact() && recv.guardsIntact())
          << desc << ": guard bytes overwritten";

      // Both directions: to next then to prev; receive from prev then next.
      desc = where("bidirectional ring", t, count, n);
      ctx.step(desc);
      uint64_t seedNext = ++seed, seedPrev = ++seed;
      GuardedBuffer toNext(t, count), toPrev(t, count), fromPrev(t, count), fromNext(t, count);
      fillInput(t, Kind::kCopy, seedNext, me, toNext.data(), count);
      fillInput(t, Kind::kCopy, seedPrev, me, toPrev.data(), count);
      RANK_ASSERT_OK(braidGroupStart());
      RANK_ASSERT_OK(braidSend(toNext.data(), count, t, next, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidSend(toPrev.data(), count, t, prev, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidRecv(fromPrev.data(), count, t, prev, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidRecv(fromNext.data(), count, t, next, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidGroupEnd()) << desc;
      expectCopy(desc + " (from prev)", t, fromPrev.data(), count, seedNext, prev);
      expectCopy(desc + " (from next)", t, fromNext.data(), count, seedPrev, next);
    }
  }
  for (size_t count : {size_t{1}, size_t{4099}}) {
    braidDataType_t t = braidUint32;
    std::string desc = where("all-to-all of Send/Recv in a nested group", t, count, n);
    ctx.step(desc);
    ++seed;
    size_t total = count * n;
    GuardedBuffer send(t, total), recv(t, total);
    fillInput(t, Kind::kCopy, seed, me, send.data(), total);
    RANK_ASSERT_OK(braidGroupStart());
    for (int p = 0; p < n; ++p) {
      RANK_ASSERT_OK(braidGroupStart());
      RANK_ASSERT_OK(braidSend(send.bytes() + p * count * 4, count, t, p, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidRecv(recv.bytes() + p * count * 4, count, t, p, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidGroupEnd());
    }
    RANK_ASSERT_OK(braidGroupEnd()) << desc;
    for (int p = 0; p < n; ++p)
      expectCopy(desc + " part " + std::to_string(p), t, recv.bytes() + p * count * 4, count, seed,
                 p, me * count);
  }
  // Blocking pairs (0,1), (2,3), ... outside any group.
  int partner = me ^ 1;
  if (partner < n) {
    braidDataType_t t = braidFloat64;
    size_t count = 3000;
    std::string desc = where("blocking Send/Recv pair", t, count, n);
    ctx.step(desc);
    ++seed;
    GuardedBuffer send(t, count), recv(t, count);
    fillInput(t, Kind::kCopy, seed, me, send.data(), count);
    if (me % 2 == 0) {
      RANK_ASSERT_OK(braidSend(send.data(), count, t, partner, ctx.comm, nullptr)) << desc;
      RANK_ASSERT_OK(braidRecv(recv.data(), count, t, partner, ctx.comm, nullptr)) << desc;
    } else {
      RANK_ASSERT_OK(braidRecv(recv.data(), count, t, partner, ctx.comm, nullptr)) << desc;
      RANK_ASSERT_OK(braidSend(send.data(), count, t, partner, ctx.comm, nullptr)) << desc;
    }
    expectCopy(desc, t, recv.data(), count, seed, partner);
  }
  ctx.step("final barrier");
  RANK_ASSERT_OK(braidBarrier(ctx.comm, nullptr));
}

// Queues an ordered sequence on `stream`: x = rank + 1 + salt; x = sum(x);
// x = prod(x) (so x = S^n, which differs if the two run out of order);
// then a broadcast from the last rank of a value only it has.
struct Sequence {
  std::vector<int64_t> x, b;
  int64_t salt;
  void enqueue(RankContext& ctx, braidStream_t s) {
    x.assign(16, ctx.rank + 1 + salt);
    b.assign(16, ctx.rank == ctx.nranks - 1 ? 4242 + salt : -1);
    RANK_ASSERT_OK(braidAllReduce(x.data(), x.data(), x.size(), braidInt64, braidSum, ctx.comm, s));
    RANK_ASSERT_OK(
        braidAllReduce(x.data(), x.data(), x.size(), braidInt64, braidProd, ctx.comm, s));
    RANK_ASSERT_OK(
        braidBroadcast(b.data(), b.data(), b.size(), braidInt64, ctx.nranks - 1, ctx.comm, s));
  }
  void check(RankContext& ctx) {
    int n = ctx.nranks;
    uint64_t sum = 0, pow = 1;
    for (int r = 0; r < n; ++r) sum += static_cast<uint64_t>(r + 1 + salt);
    for (int r = 0; r < n; ++r) pow *= sum;
    for (size_t i = 0; i < x.size(); ++i)
      RANK_EXPECT_EQ(x[i], static_cast<int64_t>(pow)) << "salt " << salt;
    for (size_t i = 0; i < b.size(); ++i) RANK_EXPECT_EQ(b[i], 4242 + salt) << "salt " << salt;
  }
};

void streamBody(RankContext& ctx) {
  int n = ctx.nranks;
  ctx.step("braidStreamCreate");
  braidStream_t s = nullptr;
  RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &s));
  RANK_ASSERT_TRUE(s != nullptr);

  ctx.step("8 AllReduces queued on one stream");
  constexpr int kCalls = 8;
  constexpr size_t kCount = 50000;
  std::vector<std::vector<float>> in(kCalls), out(kCalls);
  for (int k = 0; k < kCalls; ++k) {
    in[k].assign(kCount, static_cast<float>(ctx.rank * (k + 1)));
    out[k].assign(kCount, -1.f);
    RANK_ASSERT_OK(
        braidAllReduce(in[k].data(), out[k].data(), kCount, braidFloat32, braidSum, ctx.comm, s));
  }
  braidResult_t q = braidStreamQuery(s);
  RANK_EXPECT_TRUE(q == braidSuccess || q == braidInProgress)
      << describeResult(q, "braidStreamQuery");
  RANK_ASSERT_OK(braidStreamSynchronize(s));
  RANK_EXPECT_EQ(braidStreamQuery(s), braidSuccess);
  for (int k = 0; k < kCalls; ++k) {
    float expect = static_cast<float>((k + 1) * n * (n - 1) / 2);
    RANK_EXPECT_TRUE(
        std::all_of(out[k].begin(), out[k].end(), [&](float v) { return v == expect; }))
        << "stream AllReduce " << k << ": expected " << expect << " everywhere, first is "
        << out[k][0];
    RANK_EXPECT_TRUE(
        std::all_of(in[k].begin(), in[k].end(),
                    [&](float v) { return v == static_cast<float>(ctx.rank * (k + 1)); }))
        << "stream AllReduce " << k << " modified sendbuff";
  }

  ctx.step("ordered sequence on one stream");
  Sequence one{{}, {}, 0};
  one.enqueue(ctx, s);
  RANK_ASSERT_OK(braidStreamSynchronize(s));
  one.check(ctx);

  ctx.step("two streams, each with an ordered sequence");
  braidStream_t s2 = nullptr;
  RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &s2));
  Sequence a{{}, {}, 1}, b{{}, {}, 2};
  a.enqueue(ctx, s);
  b.enqueue(ctx, s2);
  RANK_ASSERT_OK(braidStreamSynchronize(s2));
  RANK_ASSERT_OK(braidStreamSynchronize(s));
  a.check(ctx);
  b.check(ctx);
  braidResult_t async = braidInternalError;
  RANK_ASSERT_OK(braidCommGetAsyncError(ctx.comm, &async));
  RANK_EXPECT_EQ(async, braidSuccess);

  ctx.step("Send/Recv ring on a stream inside a group");
  std::vector<int32_t> ringSend(777, ctx.rank), ringRecv(777, -1);
  RANK_ASSERT_OK(braidGroupStart());
  RANK_ASSERT_OK(
      braidSend(ringSend.data(), ringSend.size(), braidInt32, (ctx.rank + 1) % n, ctx.comm, s2));
  RANK_ASSERT_OK(braidRecv(ringRecv.data(), ringRecv.size(), braidInt32, (ctx.rank + n - 1) % n,
                           ctx.comm, s2));
  RANK_ASSERT_OK(braidGroupEnd());
  RANK_ASSERT_OK(braidStreamSynchronize(s2));
  RANK_EXPECT_EQ(ringRecv[0], (ctx.rank + n - 1) % n);
  RANK_EXPECT_EQ(ringRecv.back(), (ctx.rank + n - 1) % n);

  ctx.step("braidStreamDestroy with queued work");
  Sequence c{{}, {}, 3};
  c.enqueue(ctx, s2);
  RANK_ASSERT_OK(braidStreamDestroy(s2));  // waits for the queued calls
  c.check(ctx);
  RANK_ASSERT_OK(braidStreamDestroy(s));
  ctx.step("final barrier");
  RANK_ASSERT_OK(braidBarrier(ctx.comm, nullptr));
}

std::string sizeName(const ::testing::TestParamInfo<int>& info) {
  std::string name = "n";
  return name += std::to_string(info.param);
}

class PointToPoint : public ::testing::TestWithParam<int> {};
TEST_P(PointToPoint, RingInGroups) {
  runRanks(GetParam(), ringBody, kTimeout);
}
INSTANTIATE_TEST_SUITE_P(WorldSize, PointToPoint, ::testing::Values(1, 2, 3, 5, 8), sizeName);

// With a 4 KiB chunk the large messages of the ring cross in eight pieces of
// whole elements and a ninth of the rest (65537 elements of 8 bytes: eight
// of 65536 bytes and one of 8), several to one peer in a group: every byte
// must land where a whole message would have put it.
class PointToPointInPieces : public ::testing::TestWithParam<int> {};
TEST_P(PointToPointInPieces, RingInGroups) {
  RunOptions options;
  options.env = {{"BRAID_CHUNK_BYTES", "4096"}};
  runRanks(GetParam(), ringBody, kTimeout, options);
}
INSTANTIATE_TEST_SUITE_P(WorldSize, PointToPointInPieces, ::testing::Values(2, 3, 5), sizeName);

class Streams : public ::testing::TestWithParam<int> {};
TEST_P(Streams, OrderedAndConcurrent) {
  runRanks(GetParam(), streamBody, kTimeout);
}
INSTANTIATE_TEST_SUITE_P(WorldSize, Streams, ::testing::Values(1, 2, 3, 5, 8), sizeName);

// braidCommDestroy waits for the calls still queued on the streams of the
// communicator, then frees them too.
TEST(Streams, CommDestroyWaitsForQueuedCalls) {
  runRanks(
      3,
      [](RankContext& ctx) {
        braidStream_t s = nullptr;
        RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &s));
        Sequence seq{{}, {}, 5};
        seq.enqueue(ctx, s);
        RANK_ASSERT_OK(braidCommDestroy(ctx.comm));
        ctx.comm = nullptr;  // destroyed here, not by the harness
        seq.check(ctx);
      },
      kTimeout);
}

TEST(Trace, EverythingWorksWithDebugTrace) {
  RunOptions options;
  options.env = {{"BRAID_DEBUG", "TRACE"}};
  runRanks(
      2,
      [](RankContext& ctx) {
        std::vector<float> x(1000, 1.f);
        RANK_ASSERT_OK(braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum,
                                      ctx.comm, nullptr));
        RANK_EXPECT_EQ(x[999], 2.f);
        ringBody(ctx);
        streamBody(ctx);
      },
      kTimeout, options);
}

// ---- Failures between real processes ---------------------------------------

// Rank 0 calls call(ctx, true), the others call(ctx, false). Every rank
// must see braidInvalidUsage, with a message that mentions every one of
// `words`: from the mismatched call itself, or at the latest from one of
// the next two calls on the communicator (Barriers here). The later report
// is for ranks that cannot know at the time: a root of a Broadcast receives
// nothing, so two ranks that each think they are the root both complete; a
// sender cannot see that its receiver expected another count; a rank that
// got no stray message hears from the peers that did.
//
// The mismatched calls start once every rank is past its init: a rank still
// in its init's last call when its peers fail the communicator over their
// mismatch fails that init with their report (seen once under ASan, at 3
// ranks over TCP), and the harness counts a failed init as a failure.
// The ranks meet in memory the forked processes share, not through braid.
class RanksPastInit {
 public:
  RanksPastInit()
      : count_(static_cast<std::atomic<int>*>(::mmap(nullptr, sizeof(std::atomic<int>),
                                                     PROT_READ | PROT_WRITE,
                                                     MAP_SHARED | MAP_ANONYMOUS, -1, 0))) {
    new (count_) std::atomic<int>(0);
  }
  ~RanksPastInit() { ::munmap(count_, sizeof(std::atomic<int>)); }
  RanksPastInit(const RanksPastInit&) = delete;
  RanksPastInit& operator=(const RanksPastInit&) = delete;

  // Whether all `n` ranks arrived within 60 s.
  bool arriveAndWait(int n) {
    count_->fetch_add(1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (count_->load() < n) {
      if (std::chrono::steady_clock::now() > until) return false;
      ::usleep(1000);
    }
    return true;
  }

 private:
  std::atomic<int>* count_;
};

void expectMismatch(const char* what, std::function<braidResult_t(RankContext&, bool)> call,
                    std::vector<std::string> words = {}) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::string(what) + ", nranks " + std::to_string(n));
    RunOptions options;
    options.braidTimeoutSeconds = 20;  // a hang shows as braidTimeout, not as a kill
    RanksPastInit pastInit;
    runRanks(
        n,
        [&](RankContext& ctx) {
          ctx.step("waiting for every rank to finish init");
          RANK_ASSERT_TRUE(pastInit.arriveAndWait(ctx.nranks));
          ctx.step(std::string("mismatched ") + what);
          braidResult_t r = call(ctx, ctx.rank == 0);
          std::string msg = braidGetLastError(nullptr);
          // A rank that got nothing stray learns from the peers that did,
          // which may detect it during their next call: two calls at most.
          for (int next = 0; next < 2 && r == braidSuccess; ++next) {
            r = braidBarrier(ctx.comm, nullptr);
            msg = braidGetLastError(nullptr);
          }
          RANK_EXPECT_EQ(r, braidInvalidUsage) << "mismatched " << what << ": " << msg;
          for (const auto& w : words)
            RANK_EXPECT_TRUE(mentions(msg, w))
                << "message \"" << msg << "\" does not mention " << w;
          ::usleep(500000);  // leave the peers time to see the mismatch before exiting
        },
        kTimeout, options);
  }
}

TEST(Failures, MismatchedCallsReturnInvalidUsage) {
  static float a[64], b[64];
  const auto f32 = braidFloat32;
  expectMismatch("count", [](RankContext& c, bool z) {
    return braidAllReduce(a, b, z ? 10 : 11, f32, braidSum, c.comm, nullptr);
  });
  expectMismatch("collective",
                 [](RankContext& c, bool z) {
                   return z ? braidAllReduce(a, b, 10, f32, braidSum, c.comm, nullptr)
                            : braidBroadcast(a, b, 10, f32, 0, c.comm, nullptr);
                 },
                 {"AllReduce", "Broadcast"});
  expectMismatch("root", [](RankContext& c, bool z) {
    return braidBroadcast(a, b, 10, f32, z ? 0 : 1, c.comm, nullptr);
  });
  expectMismatch("datatype", [](RankContext& c, bool z) {
    return braidAllReduce(a, b, 10, z ? f32 : braidInt32, braidSum, c.comm, nullptr);
  });
  expectMismatch("op", [](RankContext& c, bool z) {
    return braidAllReduce(a, b, 10, f32, z ? braidSum : braidMax, c.comm, nullptr);
  });
  expectMismatch("Send/Recv count", [](RankContext& c, bool z) {
    braidResult_t r = braidGroupStart();
    if (r == braidSuccess)
      r = braidSend(a, z ? 5 : 6, f32, (c.rank + 1) % c.nranks, c.comm, nullptr);
    if (r == braidSuccess)
      r = braidRecv(b, z ? 5 : 6, f32, (c.rank + c.nranks - 1) % c.nranks, c.comm, nullptr);
    braidResult_t end = braidGroupEnd();
    return r == braidSuccess ? end : r;
  });
}

// Ranks that set BRAID_CHUNK_BYTES differently would cut their messages
// into different pieces: init fails on every rank, naming the setting, the
// rank and both values, rather than a call failing or waiting later.
TEST(Failures, RanksThatSetAnotherChunkSizeFailAtInitNamingIt) {
  RunOptions options;
  options.initComm = false;
  runRanks(
      3,
      [](RankContext& ctx) {
        ::setenv("BRAID_CHUNK_BYTES", ctx.rank == 2 ? "65536" : "524288", 1);
        braidComm_t comm = nullptr;
        const braidResult_t r = braidCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank);
        RANK_EXPECT_EQ(r, braidInvalidUsage);
        const std::string msg = braidGetLastError(nullptr);
        RANK_EXPECT_TRUE(mentions(msg, "BRAID_CHUNK_BYTES is 65536 on rank 2 but 524288 on rank 0"))
            << msg;
        if (r == braidSuccess) braidCommDestroy(comm);
      },
      kTimeout, options);
}

TEST(Failures, MismatchOnAStreamIsReportedBySynchronize) {
  runRanks(
      2,
      [](RankContext& ctx) {
        braidStream_t s = nullptr;
        RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &s));
        std::vector<float> x(64, 1.f);
        size_t count = ctx.rank == 0 ? 10 : 11;
        RANK_ASSERT_OK(
            braidAllReduce(x.data(), x.data(), count, braidFloat32, braidSum, ctx.comm, s));
        RANK_EXPECT_EQ(braidStreamSynchronize(s), braidInvalidUsage) << braidGetLastError(nullptr);
        RANK_EXPECT_EQ(braidStreamSynchronize(s), braidInvalidUsage) << "the error must stay";
        RANK_EXPECT_EQ(braidStreamQuery(s), braidInvalidUsage);
        braidResult_t async = braidSuccess;
        RANK_ASSERT_OK(braidCommGetAsyncError(ctx.comm, &async));
        RANK_EXPECT_EQ(async, braidInvalidUsage);
        (void)braidStreamDestroy(s);
      },
      kTimeout);
}

void deadPeerBody(RankContext& ctx) {
  int dead = ctx.nranks - 1;
  if (ctx.rank == dead) {
    ctx.step("exiting without braidCommDestroy");
    ::_exit(0);
  }
  ::usleep(300000);
  ctx.step("AllReduce with a dead peer");
  std::vector<float> x(kEngineFloats, 1.f);
  braidResult_t r =
      braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, ctx.comm, nullptr);
  std::string msg = braidGetLastError(nullptr);
  RANK_EXPECT_EQ(r, braidRemoteError) << msg;
  // With two ranks the peer that failed is unambiguous.
  if (ctx.nranks == 2) {
    RANK_EXPECT_TRUE(mentions(msg, "rank " + std::to_string(dead)))
        << "\"" << msg << "\" does not name the peer";
  }
}

TEST(Failures, DeadPeerGivesRemoteError) {
  runRanks(2, deadPeerBody, kTimeout);
  runRanks(4, deadPeerBody, kTimeout);
}

TEST(Failures, AbortFromAnotherThreadEndsTheCallInFlight) {
  runRanks(
      2,
      [](RankContext& ctx) {
        std::vector<float> x(kEngineFloats, 1.f);
        if (ctx.rank == 1) {
          ::usleep(1500000);  // rank 0 aborted meanwhile
          braidResult_t r = braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum,
                                           ctx.comm, nullptr);
          RANK_EXPECT_EQ(r, braidRemoteError) << braidGetLastError(nullptr);
          return;
        }
        std::thread aborter([&] {
          ::usleep(300000);
          RANK_EXPECT_OK(braidCommAbort(ctx.comm));
        });
        auto start = std::chrono::steady_clock::now();
        braidResult_t r =
            braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, ctx.comm, nullptr);
        double s = secondsSince(start);
        std::string msg = braidGetLastError(nullptr);
        aborter.join();
        RANK_EXPECT_EQ(r, braidInvalidUsage) << msg;
        RANK_EXPECT_TRUE(mentions(msg, "aborted")) << msg;
        RANK_EXPECT_TRUE(s < 1.5) << "the aborted call returned after " << s << " s";
        RANK_EXPECT_EQ(braidBarrier(ctx.comm, nullptr), braidInvalidUsage);
      },
      kTimeout);
}

void stalledPeerBody(RankContext& ctx, bool setOnCommunicator) {
  if (setOnCommunicator) {
    RANK_ASSERT_OK(braidCommSetTimeout(ctx.comm, 1.0));
    RANK_EXPECT_EQ(braidCommSetTimeout(ctx.comm, 0.0), braidInvalidArgument);
    RANK_EXPECT_EQ(braidCommSetTimeout(nullptr, 1.0), braidInvalidArgument);
  }
  std::vector<float> x(kEngineFloats, 1.f);
  if (ctx.rank == 1) {
    ::usleep(3000000);
    (void)braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, ctx.comm, nullptr);
    return;  // whatever it returns, it must return
  }
  auto start = std::chrono::steady_clock::now();
  braidResult_t r =
      braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, ctx.comm, nullptr);
  double s = secondsSince(start);
  std::string msg = braidGetLastError(nullptr);
  RANK_EXPECT_EQ(r, braidTimeout) << msg;
  RANK_EXPECT_TRUE(s > 0.9 && s < 2.5) << "BRAID_TIMEOUT=1 returned after " << s << " s";
  // The call, how far it got, and the peer and step it waits for.
  for (std::string word : {"braidAllReduce #", "steps done", "from rank 1", "step "})
    RANK_EXPECT_TRUE(mentions(msg, word)) << "\"" << msg << "\" does not say " << word;
}

TEST(Failures, StalledPeerGivesTimeout) {
  RunOptions options;
  options.braidTimeoutSeconds = 1;
  runRanks(
      2, [](RankContext& ctx) { stalledPeerBody(ctx, false); }, kTimeout, options);
}

// The same with the timeout set on the communicator (BRAID_TIMEOUT stays 60).
TEST(Failures, StalledPeerGivesTheCommunicatorsTimeout) {
  runRanks(
      2, [](RankContext& ctx) { stalledPeerBody(ctx, true); }, kTimeout);
}

// SIGUSR1 makes a call in flight log what it waits for (BRAID_DEBUG=INFO).
TEST(Diagnostics, SigusrOneDumpsTheCallInFlight) {
  RunOptions options;
  options.env = {{"BRAID_DEBUG", "INFO"}};
  runRanks(
      2,
      [](RankContext& ctx) {
        std::vector<float> x(kEngineFloats, 1.f);
        if (ctx.rank == 1) {
          ::usleep(1500000);  // rank 0 waits in its AllReduce meanwhile
          RANK_EXPECT_OK(braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum,
                                        ctx.comm, nullptr));
          return;
        }
        char path[] = "/tmp/braid-dump-XXXXXX";
        int log = ::mkstemp(path);
        RANK_ASSERT_TRUE(log >= 0);
        ::unlink(path);
        int savedStderr = ::dup(2);
        ::dup2(log, 2);
        std::thread signaller([] {
          ::usleep(500000);
          ::kill(::getpid(), SIGUSR1);
        });
        braidResult_t r =
            braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, ctx.comm, nullptr);
        signaller.join();
        ::dup2(savedStderr, 2);
        ::close(savedStderr);
        RANK_EXPECT_EQ(r, braidSuccess) << braidGetLastError(nullptr);
        std::string text(1 << 16, '\0');
        ssize_t n = ::pread(log, text.data(), text.size(), 0);
        ::close(log);
        text.resize(n > 0 ? static_cast<size_t>(n) : 0);
        RANK_EXPECT_TRUE(mentions(text, "in flight on rank 0: braidAllReduce #"))
            << "stderr was: " << text;
        RANK_EXPECT_TRUE(mentions(text, "from rank 1")) << "stderr was: " << text;
      },
      kTimeout, options);
}

// ---- braidCommInitFromEnv ---------------------------------------------------

int freeLocalPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    ADD_FAILURE() << "no free port";
  ::close(fd);
  return ntohs(a.sin_port);
}

void initFromEnv(const char* rankVariable, std::vector<std::pair<std::string, std::string>> env) {
  RunOptions options;
  options.createId = false;
  options.env = std::move(env);
  runRanks(
      3,
      [&](RankContext& ctx) {
        ::setenv(rankVariable, std::to_string(ctx.rank).c_str(), 1);
        RANK_ASSERT_OK(braidCommInitFromEnv(&ctx.comm));
        int count = -1, rank = -1;
        RANK_ASSERT_OK(braidCommCount(ctx.comm, &count));
        RANK_ASSERT_OK(braidCommUserRank(ctx.comm, &rank));
        RANK_EXPECT_EQ(count, 3);
        RANK_EXPECT_EQ(rank, ctx.rank);
        int32_t mine = ctx.rank + 1, sum = 0;
        RANK_ASSERT_OK(braidAllReduce(&mine, &sum, 1, braidInt32, braidSum, ctx.comm, nullptr));
        RANK_EXPECT_EQ(sum, 6);
      },
      kTimeout, options);
}

TEST(InitFromEnv, BraidVariablesWithSecret) {
  initFromEnv("BRAID_RANK", {{"BRAID_WORLD_SIZE", "3"},
                             {"BRAID_ADDR", "127.0.0.1:" + std::to_string(freeLocalPort())},
                             {"BRAID_SECRET", "0123456789abcdef0123456789ABCDEF"}});
}

TEST(InitFromEnv, TorchrunVariables) {
  initFromEnv("RANK", {{"WORLD_SIZE", "3"},
                       {"MASTER_ADDR", "127.0.0.1"},
                       {"MASTER_PORT", std::to_string(freeLocalPort())}});
}

}  // namespace
}  // namespace braidtest
