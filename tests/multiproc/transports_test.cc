// Which transport serves each pair of ranks, on real processes: shared
// memory between ranks of this host unless told otherwise, TCP when forced
// or when /dev/shm has no room, and nothing left in /dev/shm once a
// communicator is up, so that a rank that dies later leaks nothing.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

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
