// The first GPU call of a communicator on a CUDA stream maps the memory of
// the peers of its host on the calling thread, before the stream waits:
// mapping takes the driver's memory lock, which an application thread may
// hold until the stream gets past the call. A peer that reaches its first
// GPU call late is waited for past BRAID_CUDA_IPC_CONNECT_SECONDS, as a call
// waits for its peers, for as long as the shared-memory board shows that it
// does not wait in another call; one that does (a host call this rank makes
// only later) is not waited for, so that this rank can go on to make it.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "braid.h"
#include "gpu_ranks.h"

namespace {

using namespace braid::testing::gpu_ranks;

class LatePeer : public ForkedGpuRanks {};

// Queues an AllGather of kCount floats from each rank on the CUDA stream.
int allGatherOnTheStream(Rank& r, OnACudaStream& on, int step) {
  for (size_t i = 0; i < kCount; ++i) on.send[i] = value(r.rank(), 0, i);
  RANK_CHECK(step, braidAllGather(on.send, on.recv, kCount, braidFloat32, r.comm, on.stream) ==
                       braidSuccess);
  return 0;
}

// Once the stream got past it: its result.
int checkTheAllGather(Rank& r, OnACudaStream& on, int step) {
  RANK_CHECK(step, braidStreamSynchronize(on.stream) == braidSuccess);
  RANK_CHECK(step + 1, firstWrong(on.recv, r.nranks() * kCount, [&](size_t i) {
                         return value(static_cast<int>(i / kCount), 0, i % kCount);
                       }) == -1);
  return 0;
}

// Rank 1 reaches its first GPU call 3 s after rank 0, whose wait would end
// after 1 s (BRAID_CUDA_IPC_CONNECT_SECONDS) and leave the mapping to the
// call, while the stand-in holds the memory lock.
int aLatePeerIsMappedBeforeTheStreamWaits(Rank& r) {
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  on.holdTheMemoryLock();
  if (r.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(3));
  if (const int failed = allGatherOnTheStream(r, on, 13)) return failed;
  if (const int failed = checkTheAllGather(r, on, 14)) return failed;
  return on.releaseTheMemoryLock(r, 16);
}

TEST_F(LatePeer, IsMappedBeforeTheStreamWaits) {
  RankSetup setup;
  setup.environment = {"BRAID_CUDA_IPC_CONNECT_SECONDS=1"};
  expectEveryRankPassed(runRanks(2, aLatePeerIsMappedBeforeTheStreamWaits, setup));
}

// Rank 1 first makes a host AllReduce on stream NULL, which rank 0 makes
// only after its first GPU call (which returns at once, the stream waiting
// for it): rank 0 stops waiting for rank 1's
// handshake when the board shows rank 1 in that call, rather than wait
// until BRAID_TIMEOUT, by when rank 1's AllReduce would have failed.
int aPeerInAnotherCallIsNotWaitedFor(Rank& r) {
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  float one = 1, sum = 0;
  // Rank 1's AllReduce starts first, so that it would time out before a
  // wait of BRAID_TIMEOUT on rank 0 ended.
  if (r.rank() == 0) std::this_thread::sleep_for(std::chrono::seconds(2));
  if (r.rank() == 1)
    RANK_CHECK(
        13, braidAllReduce(&one, &sum, 1, braidFloat32, braidSum, r.comm, nullptr) == braidSuccess);
  if (const int failed = allGatherOnTheStream(r, on, 14)) return failed;
  if (r.rank() == 0)
    RANK_CHECK(
        17, braidAllReduce(&one, &sum, 1, braidFloat32, braidSum, r.comm, nullptr) == braidSuccess);
  RANK_CHECK(18, sum == 2.0f);
  if (const int failed = checkTheAllGather(r, on, 19)) return failed;
  RANK_CHECK(21, fake.streamSynchronize(on.cudaStream) == 0);
  RANK_CHECK(22, braidStreamDestroy(on.stream) == braidSuccess);
  return 0;
}

TEST_F(LatePeer, OneThatWaitsInAnotherCallIsNotWaitedFor) {
  RankSetup setup;
  setup.environment = {"BRAID_CUDA_IPC_CONNECT_SECONDS=1", "BRAID_TIMEOUT=30"};
  expectEveryRankPassed(runRanks(2, aPeerInAnotherCallIsNotWaitedFor, setup));
}

}  // namespace
