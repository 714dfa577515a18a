// What ranks on real processes see when their calls mismatch, when a peer
// dies, aborts or stalls, and what a rank dumps of the call in flight.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace braidtest {
namespace {

constexpr std::chrono::seconds kTimeout{120};
// An AllReduce of this many floats (16 KiB) is past the shared-memory board's
// slot (BRAID_SHM_BOARD_BYTES), so it runs as messages through the engine,
// whose failures and diagnostics these tests look at; the board's own are
// in board_test.cc.
constexpr size_t kEngineFloats = 4096;

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

// The process that made the unique id serves the rendezvous. When its rank
// fails init and the process ends at once (_exit, as a forked worker of a
// pool does), every other rank must still get the table and so the reason,
// not "connection closed by the peer": init returns only once the server
// it hosts has answered every rank.
TEST(Failures, TheRankThatServesTheRendezvousMayExitAtOnceAfterAFailedInit) {
  RunOptions options;
  options.initComm = false;
  constexpr int kRanks = 8;
  runRanks(
      kRanks,
      [](RankContext& ctx) {
        ::setenv("BRAID_CHUNK_BYTES", ctx.rank == kRanks - 1 ? "65536" : "524288", 1);
        braidComm_t comm = nullptr;
        const braidResult_t r = braidCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank);
        if (ctx.rank == 0) ::_exit(r == braidInvalidUsage ? 0 : 1);
        RANK_EXPECT_EQ(r, braidInvalidUsage);
        const std::string msg = braidGetLastError(nullptr);
        RANK_EXPECT_TRUE(mentions(msg, "BRAID_CHUNK_BYTES is 65536 on rank 7")) << msg;
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

// Rank 0 destroys its communicator (after aborting it, if `abortFirst`)
// while its other thread's AllReduce waits for rank 1, which comes 1.5 s
// late. Destroy must wait for that call to leave the communicator. Before,
// it freed the communicator under the call, and the call's thread crashed
// (under ASan, a use after free).
void destroyWhileAnotherThreadCalls(RankContext& ctx, bool abortFirst) {
  std::vector<float> x(kEngineFloats, 1.f);
  if (ctx.rank == 1) {
    ::usleep(1500000);
    const braidResult_t r =
        braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, ctx.comm, nullptr);
    if (!abortFirst) {
      RANK_EXPECT_OK(r);
      RANK_EXPECT_EQ(x[0], 2.f);
    }
    return;
  }
  braidResult_t r = braidInternalError;
  std::atomic<bool> calling{false};
  std::thread caller([&] {
    calling = true;
    r = braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, ctx.comm, nullptr);
  });
  // Destroy must find the call inside the communicator: a call that came
  // after it would be a call on a destroyed handle.
  while (!calling) ::usleep(1000);
  ::usleep(300000);
  const auto start = std::chrono::steady_clock::now();
  if (abortFirst) {
    RANK_EXPECT_OK(braidCommAbort(ctx.comm));
  }
  RANK_EXPECT_OK(braidCommDestroy(ctx.comm));
  const double s = secondsSince(start);
  ctx.comm = nullptr;
  caller.join();
  if (abortFirst) {
    // The call ends with the abort, within a second, and so does Destroy.
    RANK_EXPECT_EQ(r, braidInvalidUsage);
    RANK_EXPECT_TRUE(s < 1.0) << "abort and destroy took " << s << " s";
  } else {
    // Destroy waits for this rank's outstanding work: the call completes
    // once rank 1 comes, 1.2 s after Destroy began.
    RANK_EXPECT_EQ(r, braidSuccess) << braidGetLastError(nullptr);
    RANK_EXPECT_EQ(x[0], 2.f);
    RANK_EXPECT_TRUE(s > 0.9) << "Destroy returned after " << s << " s, before the call ended";
  }
}

TEST(Failures, DestroyWaitsForACallInFlightOnAnotherThread) {
  runRanks(
      2, [](RankContext& ctx) { destroyWhileAnotherThreadCalls(ctx, false); }, kTimeout);
}

// The watchdog's way: abort, then destroy at once.
TEST(Failures, DestroyRightAfterAbortWaitsForTheAbortedCall) {
  runRanks(
      2, [](RankContext& ctx) { destroyWhileAnotherThreadCalls(ctx, true); }, kTimeout);
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

}  // namespace
}  // namespace braidtest
