// Which transport serves each pair of ranks, on real processes: shared
// memory between ranks of this host unless told otherwise, TCP when forced
// or when /dev/shm has no room, and nothing left in /dev/shm once a
// communicator is up, so that a rank that dies later leaks nothing.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

namespace braidtest {
namespace {

constexpr std::chrono::seconds kTimeout{120};

void expectTransports(RankContext& ctx, const std::string& expected) {
  for (int peer = 0; peer < ctx.nranks; ++peer) {
    const char* name = nullptr;
    RANK_ASSERT_OK(braidCommGetTransport(ctx.comm, peer, &name));
    RANK_EXPECT_EQ(std::string(name), peer == ctx.rank ? std::string("self") : expected)
        << "rank " << ctx.rank << " to rank " << peer;
  }
}

void allReduceWorks(RankContext& ctx) {
  std::vector<int32_t> x(100000, ctx.rank + 1);
  RANK_ASSERT_OK(
      braidAllReduce(x.data(), x.data(), x.size(), braidInt32, braidSum, ctx.comm, nullptr));
  const int32_t sum = ctx.nranks * (ctx.nranks + 1) / 2;
  RANK_EXPECT_EQ(x.front(), sum);
  RANK_EXPECT_EQ(x.back(), sum);
}

// Segments this process created that still have a name in /dev/shm.
std::vector<std::string> namedSegmentsOf(pid_t pid) {
  std::vector<std::string> found;
  const std::string prefix = "braid-" + std::to_string(pid) + "-";
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(dir))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) found.push_back(e->d_name);
    ::closedir(dir);
  }
  return found;
}

TEST(Transports, RanksOfOneHostShareMemory) {
  runRanks(
      3,
      [](RankContext& ctx) {
        expectTransports(ctx, "shm");
        allReduceWorks(ctx);
      },
      kTimeout);
}

TEST(Transports, ForcedTcp) {
  RunOptions options;
  options.env = {{"BRAID_TRANSPORT", "tcp"}};
  runRanks(
      3,
      [](RankContext& ctx) {
        expectTransports(ctx, "tcp");
        allReduceWorks(ctx);
      },
      kTimeout, options);
}

TEST(Transports, DevShmWithoutRoomFallsBackToTcp) {
  RunOptions options;
  options.env = {{"BRAID_SHM_BYTES", "1099511627776"}};  // 1 TiB rings: no /dev/shm holds them
  runRanks(
      3,
      [](RankContext& ctx) {
        expectTransports(ctx, "tcp");
        allReduceWorks(ctx);
      },
      kTimeout, options);
}

TEST(Transports, ForcedShmWithoutRoomIsAnError) {
  RunOptions options;
  options.env = {{"BRAID_SHM_BYTES", "1099511627776"}, {"BRAID_TRANSPORT", "shm"}};
  options.initComm = false;
  runRanks(
      2,
      [](RankContext& ctx) {
        braidComm_t comm = nullptr;
        braidResult_t r = braidCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank);
        RANK_EXPECT_EQ(r, braidSystemError) << braidGetLastError(nullptr);
        if (r == braidSuccess) braidCommDestroy(comm);
      },
      kTimeout, options);
}

// The lower rank of a pair sizes its rings (src/peer_links.cc), and the
// other maps them at that size: ranks whose BRAID_SHM_BYTES differ, as their
// automatic sizes may (each fits its rings to the room /dev/shm had when it
// looked), still share memory. Messages larger than every ring cross.
TEST(Transports, RanksWithDifferentRingSizesShareMemory) {
  RunOptions options;
  options.env = {{"BRAID_TRANSPORT", "shm"}, {"BRAID_SHM_CMA_BYTES", "0"}};
  options.initComm = false;
  runRanks(
      3,
      [](RankContext& ctx) {
        const std::string ring = std::to_string(size_t{65536} << ctx.rank);
        ::setenv("BRAID_SHM_BYTES", ring.c_str(), 1);
        RANK_ASSERT_OK(braidCommInitRank(&ctx.comm, ctx.nranks, ctx.id, ctx.rank));
        expectTransports(ctx, "shm");
        allReduceWorks(ctx);
        std::vector<int32_t> big(300000, ctx.rank);
        const int next = (ctx.rank + 1) % ctx.nranks, prev = (ctx.rank + 2) % ctx.nranks;
        std::vector<int32_t> got(big.size(), -1);
        RANK_ASSERT_OK(braidGroupStart());
        RANK_ASSERT_OK(braidSend(big.data(), big.size(), braidInt32, next, ctx.comm, nullptr));
        RANK_ASSERT_OK(braidRecv(got.data(), got.size(), braidInt32, prev, ctx.comm, nullptr));
        RANK_ASSERT_OK(braidGroupEnd());
        RANK_EXPECT_EQ(got.front(), prev);
        RANK_EXPECT_EQ(got.back(), prev);
      },
      kTimeout, options);
}

// Ranks that play two hosts (BRAID_HOSTID): pairs of one host share memory,
// the others keep their sockets, in one communicator. The pairs over TCP
// sit between a rank's shared-memory peers in the order it sets them up
// (src/peer_links.cc) and must lose no byte of their sockets to those
// handshakes. 5 ranks: each host holds a rank that creates several
// segments, and ranks of the other host sit between its peers.
TEST(Transports, RanksOfTwoHostsShareMemoryOnlyWithinEach) {
  RunOptions options;
  options.initComm = false;
  runRanks(
      5,
      [](RankContext& ctx) {
        const bool hostA = ctx.rank % 2 == 0;  // ranks 0, 2, 4 and ranks 1, 3
        ::setenv("BRAID_HOSTID", hostA ? "host a" : "host b", 1);
        RANK_ASSERT_OK(braidCommInitRank(&ctx.comm, ctx.nranks, ctx.id, ctx.rank));
        for (int peer = 0; peer < ctx.nranks; ++peer) {
          const char* name = nullptr;
          RANK_ASSERT_OK(braidCommGetTransport(ctx.comm, peer, &name));
          const std::string expected = peer == ctx.rank           ? "self"
                                       : (peer % 2 == 0) == hostA ? "shm"
                                                                  : "tcp";
          RANK_EXPECT_EQ(std::string(name), expected) << "rank " << ctx.rank << " to " << peer;
        }
        allReduceWorks(ctx);
        // Every pair carries a large message both ways, so that each
        // rank's single copy (where the pair shares memory) is used.
        std::vector<int32_t> mine(100000, ctx.rank);
        std::vector<std::vector<int32_t>> got(ctx.nranks, std::vector<int32_t>(mine.size(), -1));
        RANK_ASSERT_OK(braidGroupStart());
        for (int peer = 0; peer < ctx.nranks; ++peer) {
          if (peer == ctx.rank) continue;
          RANK_ASSERT_OK(braidSend(mine.data(), mine.size(), braidInt32, peer, ctx.comm, nullptr));
          RANK_ASSERT_OK(
              braidRecv(got[peer].data(), mine.size(), braidInt32, peer, ctx.comm, nullptr));
        }
        RANK_ASSERT_OK(braidGroupEnd());
        for (int peer = 0; peer < ctx.nranks; ++peer) {
          if (peer == ctx.rank) continue;
          RANK_EXPECT_EQ(got[peer].front(), peer);
          RANK_EXPECT_EQ(got[peer].back(), peer);
        }
      },
      kTimeout, options);
}

TEST(Transports, RankThatDiesLeavesNothingInDevShm) {
  runRanks(
      3,
      [](RankContext& ctx) {
        // Every segment is unlinked by the time init returns.
        RANK_EXPECT_TRUE(namedSegmentsOf(::getpid()).empty());
        allReduceWorks(ctx);
        if (ctx.rank == 1) ::_exit(0);  // no destructor, no braidCommDestroy
        std::vector<float> x(1000, 1.f);
        braidResult_t r =
            braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, ctx.comm, nullptr);
        RANK_EXPECT_EQ(r, braidRemoteError) << braidGetLastError(nullptr);
      },
      kTimeout);
}

// Mappings in this process of braidHostAlloc memory, its own and its peers'.
size_t sharedAllocationMappings() {
  size_t n = 0;
  if (FILE* f = std::fopen("/proc/self/maps", "r")) {
    char line[4096];
    while (std::fgets(line, sizeof line, f))
      n += std::strstr(line, "memfd:braid-host-alloc") != nullptr;
    std::fclose(f);
  }
  return n;
}

// Buffers of braidHostAlloc: every collective and Send/Recv gives exact
// results while the ranks read each other's buffers through mappings (more
// mappings than the rank's own two), buffers freed and allocated again are
// read afresh, and destroying the communicator lets the peers' mappings go.
TEST(Transports, BraidHostAllocBuffersAreReadInPlace) {
  for (int nranks : {2, 3}) {
    RunOptions options;
    options.initComm = false;
    runRanks(
        nranks,
        [](RankContext& ctx) {
          braidComm_t comm = nullptr;
          RANK_ASSERT_OK(braidCommInitRank(&comm, ctx.nranks, ctx.id, ctx.rank));
          const int n = ctx.nranks, me = ctx.rank;
          const size_t count = 96 * 1024;  // 384 KiB per rank: above BRAID_SHM_CMA_BYTES
          const size_t bytes = count * n * sizeof(int32_t);
          const size_t ownMappings = sharedAllocationMappings();
          for (int round = 0; round < 2; ++round) {
            ctx.step("round " + std::to_string(round));
            void *sendMemory = nullptr, *recvMemory = nullptr;
            RANK_ASSERT_OK(braidHostAlloc(&sendMemory, bytes));
            RANK_ASSERT_OK(braidHostAlloc(&recvMemory, bytes));
            auto* send = static_cast<int32_t*>(sendMemory);
            auto* recv = static_cast<int32_t*>(recvMemory);
            auto value = [&](int rank, size_t i) {
              return static_cast<int32_t>(rank * 1000003 + i * 7 + round);
            };
            auto fill = [&] {
              for (size_t i = 0; i < count * n; ++i) send[i] = value(me, i);
            };
            auto sumOf = [&](size_t i) {
              int32_t s = 0;
              for (int r = 0; r < n; ++r) s += value(r, i);
              return s;
            };
            size_t wrong = 0;
            auto check = [&](const char* what, bool ok) {
              if (!ok && wrong++ == 0) currentRank().fail(__FILE__, __LINE__, what);
            };

            fill();
            RANK_ASSERT_OK(
                braidAllReduce(send, recv, count * n, braidInt32, braidSum, comm, nullptr));
            for (size_t i = 0; i < count * n; ++i) check("allreduce", recv[i] == sumOf(i));
            RANK_ASSERT_OK(
                braidAllReduce(send, send, count * n, braidInt32, braidSum, comm, nullptr));
            for (size_t i = 0; i < count * n; ++i) check("allreduce in place", send[i] == sumOf(i));

            fill();
            RANK_ASSERT_OK(braidAllGather(send, recv, count, braidInt32, comm, nullptr));
            for (int r = 0; r < n; ++r)
              for (size_t i = 0; i < count; ++i)
                check("allgather", recv[r * count + i] == value(r, i));

            fill();
            RANK_ASSERT_OK(braidBroadcast(send, recv, count * n, braidInt32, n - 1, comm, nullptr));
            for (size_t i = 0; i < count * n; ++i) check("broadcast", recv[i] == value(n - 1, i));

            RANK_ASSERT_OK(
                braidReduceScatter(send, recv, count, braidInt32, braidSum, comm, nullptr));
            for (size_t i = 0; i < count; ++i)
              check("reducescatter", recv[i] == sumOf(me * count + i));

            RANK_ASSERT_OK(braidAllToAll(send, recv, count, braidInt32, comm, nullptr));
            for (int r = 0; r < n; ++r)
              for (size_t i = 0; i < count; ++i)
                check("alltoall", recv[r * count + i] == value(r, me * count + i));

            RANK_ASSERT_OK(braidGroupStart());
            RANK_ASSERT_OK(braidSend(send, count * n, braidInt32, (me + 1) % n, comm, nullptr));
            RANK_ASSERT_OK(braidRecv(recv, count * n, braidInt32, (me + n - 1) % n, comm, nullptr));
            RANK_ASSERT_OK(braidGroupEnd());
            for (size_t i = 0; i < count * n; ++i)
              check("send/recv", recv[i] == value((me + n - 1) % n, i));
            RANK_EXPECT_EQ(wrong, 0u);
            RANK_EXPECT_TRUE(sharedAllocationMappings() > ownMappings + 2);
            RANK_ASSERT_OK(braidHostFree(sendMemory));
            RANK_ASSERT_OK(braidHostFree(recvMemory));
          }
          RANK_ASSERT_OK(braidCommDestroy(comm));
          RANK_EXPECT_EQ(sharedAllocationMappings(), ownMappings);
        },
        kTimeout, options);
  }
}

TEST(Transports, HostAllocChecksItsArguments) {
  void* p = nullptr;
  EXPECT_EQ(braidHostAlloc(nullptr, 64), braidInvalidArgument);
  EXPECT_EQ(braidHostAlloc(&p, 0), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError(nullptr)).find("size is 0"), std::string::npos);
  EXPECT_EQ(braidHostFree(nullptr), braidSuccess);
  int onTheStack = 0;
  EXPECT_EQ(braidHostFree(&onTheStack), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError(nullptr)).find("not an allocation of braidHostAlloc"),
            std::string::npos);
  ASSERT_EQ(braidHostAlloc(&p, 100), braidSuccess);
  ASSERT_NE(p, nullptr);
  static_cast<char*>(p)[99] = 1;
  EXPECT_EQ(braidHostFree(p), braidSuccess);
  EXPECT_EQ(braidHostFree(p), braidInvalidArgument) << "freed twice";
}

TEST(Transports, QueryChecksItsArguments) {
  runRanks(
      2,
      [](RankContext& ctx) {
        const char* name = nullptr;
        RANK_EXPECT_EQ(braidCommGetTransport(ctx.comm, 2, &name), braidInvalidArgument);
        RANK_EXPECT_EQ(braidCommGetTransport(ctx.comm, -1, &name), braidInvalidArgument);
        RANK_EXPECT_EQ(braidCommGetTransport(ctx.comm, 0, nullptr), braidInvalidArgument);
        RANK_EXPECT_EQ(braidCommGetTransport(nullptr, 0, &name), braidInvalidArgument);
      },
      kTimeout);
}

}  // namespace
}  // namespace braidtest

namespace braidtest {
namespace {

size_t entriesIn(const char* dir) {
  size_t n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

// Lines of a file that contain `text`.
size_t linesWith(const char* path, const std::string& text) {
  size_t n = 0;
  if (FILE* f = std::fopen(path, "r")) {
    char line[4096];
    while (std::fgets(line, sizeof line, f)) n += std::strstr(line, text.c_str()) != nullptr;
    std::fclose(f);
  }
  return n;
}

struct Resources {
  size_t fds, threads, segmentMappings, segmentNames;
  bool operator==(const Resources&) const = default;
};

Resources countResources() {
  // Thread stacks and malloc arenas stay mapped for reuse after their
  // owners are gone, so of the mappings only the shared-memory segments
  // (shown as /dev/shm/braid-... (deleted)) are counted.
  return {entriesIn("/proc/self/fd"), entriesIn("/proc/self/task"),
          linesWith("/proc/self/maps", "/dev/shm/braid-"), namedSegmentsOf(::getpid()).size()};
}

// countResources once `settled` holds of it, or after a second: the threads
// and descriptors of a communicator just destroyed (rank 0's rendezvous
// thread among them) go a moment later.
template <typename Settled>
Resources resourcesOnce(Settled settled) {
  Resources now = countResources();
  for (int i = 0; i < 50 && !settled(now); ++i) {
    ::usleep(20000);
    now = countResources();
  }
  return now;
}

// A new communicator of ctx's ranks, from a fresh unique id made by rank 0
// and handed round on the harness's communicator.
braidComm_t newCommunicatorOf(RankContext& ctx) {
  braidUniqueId id{};
  if (ctx.rank == 0) {
    RANK_ASSERT_OK(braidGetUniqueId(&id));
  }
  RANK_ASSERT_OK(braidBroadcast(&id, &id, sizeof(id), braidUint8, 0, ctx.comm, nullptr));
  braidComm_t comm = nullptr;
  RANK_ASSERT_OK(braidCommInitRank(&comm, ctx.nranks, id, ctx.rank));
  return comm;
}

// A communicator that did work, was aborted and destroyed, leaves no fd,
// thread, mapping or /dev/shm segment behind. The first cycle is a warm-up:
// libraries (OpenSSL, hwloc) keep what they load once.
TEST(Resources, AbortAndDestroyLeaveNothingBehind) {
  runRanks(
      3,
      [](RankContext& ctx) {
        Resources before{};
        for (int cycle = 0; cycle < 3; ++cycle) {
          if (cycle == 1) before = countResources();
          braidComm_t comm = newCommunicatorOf(ctx);
          std::vector<float> x(1 << 18, 1.f);
          RANK_ASSERT_OK(
              braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, comm, nullptr));
          braidStream_t stream = nullptr;
          RANK_ASSERT_OK(braidStreamCreate(comm, &stream));
          RANK_ASSERT_OK(
              braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, comm, stream));
          RANK_ASSERT_OK(braidStreamSynchronize(stream));
          RANK_ASSERT_OK(braidStreamDestroy(stream));
          // A rank that leaves the Barrier first aborts while others may still
          // be in it, and its abort reaches them: both outcomes are fine.
          braidResult_t barrier = braidBarrier(comm, nullptr);
          RANK_EXPECT_TRUE(barrier == braidSuccess || barrier == braidRemoteError)
              << braidGetLastError(nullptr);
          RANK_ASSERT_OK(braidCommAbort(comm));
          RANK_ASSERT_OK(braidCommDestroy(comm));
        }
        // Rank 0's rendezvous thread of the last cycle ends once everyone
        // joined; give it a moment.
        const Resources after = resourcesOnce([&](const Resources& r) { return r == before; });
        RANK_EXPECT_EQ(after.fds, before.fds);
        RANK_EXPECT_EQ(after.threads, before.threads);
        RANK_EXPECT_EQ(after.segmentMappings, before.segmentMappings);
        RANK_EXPECT_EQ(after.segmentNames, 0u);
      },
      kTimeout);
}

// braidCommDestroy frees the communicator even where the program keeps a
// stream handle of it: the stream's own thread is all that stays until
// braidStreamDestroy. A stream of a destroyed communicator still answers:
// its calls ran, and a callback added later runs, told of the destroy.
// Before, the stream held the whole communicator (its connections,
// shared-memory board and segments) until the stream was destroyed.
TEST(Resources, DestroyFreesTheCommunicatorOfAStreamStillHeld) {
  runRanks(
      2,
      [](RankContext& ctx) {
        Resources before{};
        for (int cycle = 0; cycle < 3; ++cycle) {
          if (cycle == 1) before = countResources();
          braidComm_t comm = newCommunicatorOf(ctx);
          std::vector<float> x(1 << 18, 1.f);
          braidStream_t stream = nullptr;
          RANK_ASSERT_OK(braidStreamCreate(comm, &stream));
          RANK_ASSERT_OK(
              braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, comm, stream));
          RANK_ASSERT_OK(braidCommDestroy(comm));
          RANK_EXPECT_EQ(x[0], 2.f);
          // The stream's thread stays; everything of the communicator went.
          const Resources held =
              resourcesOnce([&](const Resources& r) { return cycle == 0 || r.fds == before.fds; });
          if (cycle > 0) {
            RANK_EXPECT_EQ(held.fds, before.fds);
            RANK_EXPECT_EQ(held.threads, before.threads + 1);
            RANK_EXPECT_EQ(held.segmentMappings, before.segmentMappings);
          }
          RANK_EXPECT_OK(braidStreamSynchronize(stream));
          std::atomic<int> told{-1};
          RANK_EXPECT_OK(braidStreamAddCallback(
              stream,
              [](braidStream_t, braidResult_t result, void* resultOut) {
                static_cast<std::atomic<int>*>(resultOut)->store(result);
              },
              &told));
          RANK_EXPECT_EQ(braidStreamSynchronize(stream), braidSuccess);
          RANK_EXPECT_EQ(told.load(), static_cast<int>(braidInvalidUsage));
          RANK_ASSERT_OK(braidStreamDestroy(stream));
        }
        const Resources after = resourcesOnce([&](const Resources& r) { return r == before; });
        RANK_EXPECT_EQ(after.fds, before.fds);
        RANK_EXPECT_EQ(after.threads, before.threads);
        RANK_EXPECT_EQ(after.segmentMappings, before.segmentMappings);
      },
      kTimeout);
}

}  // namespace
}  // namespace braidtest
