// Which transport serves each pair of ranks, on real processes: shared
// memory between ranks of this host unless told otherwise, TCP when forced
// or when /dev/shm has no room, and nothing left in /dev/shm once a
// communicator is up, so that a rank that dies later leaks nothing.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

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
          // A fresh unique id per cycle, made by rank 0 and handed round on
          // the harness's communicator.
          braidUniqueId id{};
          if (ctx.rank == 0) {
            RANK_ASSERT_OK(braidGetUniqueId(&id));
          }
          RANK_ASSERT_OK(braidBroadcast(&id, &id, sizeof(id), braidUint8, 0, ctx.comm, nullptr));
          braidComm_t comm = nullptr;
          RANK_ASSERT_OK(braidCommInitRank(&comm, ctx.nranks, id, ctx.rank));
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
        Resources after = countResources();
        for (int i = 0; i < 50 && !(after == before); ++i) {
          ::usleep(20000);
          after = countResources();
        }
        RANK_EXPECT_EQ(after.fds, before.fds);
        RANK_EXPECT_EQ(after.threads, before.threads);
        RANK_EXPECT_EQ(after.segmentMappings, before.segmentMappings);
        RANK_EXPECT_EQ(after.segmentNames, 0u);
      },
      kTimeout);
}

}  // namespace
}  // namespace braidtest
