// GPU calls on a CUDA stream whose messages go through pinned host memory
// (transports/gpu_staged): to peers on other hosts, or to every peer with
// BRAID_CUDA_IPC=0. While the CUDA stream waits for such a call, an
// application thread may sit in a copy to pageable memory queued after it
// (tensor.cpu()), holding the driver's memory lock, so braid's threads must
// pin no memory then: the bounce buffers each connection needs are pinned
// on the calling thread, before the stream waits (Communicator::
// prepareGpuCalls, StagedConnection::reserve), and a call of any size uses
// no more than those.
#include <gtest/gtest.h>

#include "braid.h"
#include "gpu_ranks.h"

namespace {

using namespace braid::testing::gpu_ranks;

class StagedOnACudaStream : public ForkedGpuRanks {};

// Each call below is the first of its kind and size on the stream, made
// while the stand-in holds the memory lock for every call that takes it:
// an AllGather and an AllToAll of blocks of kCount floats (each message cut
// into chunk-sized pieces; the stand-in runs no reduction kernels), and a
// Send/Recv ring of pieces of an eighth of the message, larger than a
// chunk.
int stagedCallsPinNothingWhileTheStreamWaits(Rank& r) {
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  float *send = on.send, *recv = on.recv;
  const int n = r.nranks(), me = r.rank();
  for (size_t i = 0; i < n * kCount; ++i)
    send[i] = value(me, static_cast<int>(i / kCount), i % kCount);
  on.holdTheMemoryLock();

  RANK_CHECK(13,
             braidAllGather(send, recv, kCount, braidFloat32, r.comm, on.stream) == braidSuccess);
  RANK_CHECK(14, braidStreamSynchronize(on.stream) == braidSuccess);
  RANK_CHECK(15, firstWrong(recv, n * kCount, [&](size_t i) {
                   return value(static_cast<int>(i / kCount), 0, i % kCount);
                 }) == -1);

  RANK_CHECK(16,
             braidAllToAll(send, recv, kCount, braidFloat32, r.comm, on.stream) == braidSuccess);
  RANK_CHECK(17, braidStreamSynchronize(on.stream) == braidSuccess);
  RANK_CHECK(18, firstWrong(recv, n * kCount, [&](size_t i) {
                   return value(static_cast<int>(i / kCount), me, i % kCount);
                 }) == -1);

  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  RANK_CHECK(19, braidGroupStart() == braidSuccess);
  RANK_CHECK(20, braidSend(send, kCount, braidFloat32, next, r.comm, on.stream) == braidSuccess);
  RANK_CHECK(21, braidRecv(recv, kCount, braidFloat32, prev, r.comm, on.stream) == braidSuccess);
  RANK_CHECK(22, braidGroupEnd() == braidSuccess);
  RANK_CHECK(23, braidStreamSynchronize(on.stream) == braidSuccess);
  RANK_CHECK(24, firstWrong(recv, kCount, [&](size_t i) { return value(prev, 0, i); }) == -1);

  return on.releaseTheMemoryLock(r, 25);
}

TEST_F(StagedOnACudaStream, CallsOfOneHostWithoutCudaIpcPinNothingWhileTheStreamWaits) {
  RankSetup setup;
  setup.environment = {"BRAID_CUDA_IPC=0"};
  expectEveryRankPassed(runRanks(2, stagedCallsPinNothingWhileTheStreamWaits, setup));
}

// Bruck's AllGather and AllToAll receive several pieces that become ready
// at once in the middle of the call (after the blocks they forward): they
// start in their order too, so the earliest take the buffers.
TEST_F(StagedOnACudaStream, BrucksCallsAmongThreeRanksPinNothingWhileTheStreamWaits) {
  RankSetup setup;
  setup.environment = {"BRAID_CUDA_IPC=0", "BRAID_ALGO=alltoall=bruck,allgather=bruck"};
  expectEveryRankPassed(runRanks(3, stagedCallsPinNothingWhileTheStreamWaits, setup));
}

// Pieces are whole elements: with a chunk of 400003 bytes, a Send of
// 200001 floats (800004 bytes) crosses in three pieces, two of 400000
// bytes and a last of 4, and all three are pinned ahead.
int sendRecvInPiecesOfWholeElements(Rank& r) {
  constexpr size_t kOdd = 200001;
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  const int n = r.nranks(), me = r.rank();
  for (size_t i = 0; i < kOdd; ++i) on.send[i] = value(me, 0, i);
  on.holdTheMemoryLock();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  RANK_CHECK(13, braidGroupStart() == braidSuccess);
  RANK_CHECK(14, braidSend(on.send, kOdd, braidFloat32, next, r.comm, on.stream) == braidSuccess);
  RANK_CHECK(15, braidRecv(on.recv, kOdd, braidFloat32, prev, r.comm, on.stream) == braidSuccess);
  RANK_CHECK(16, braidGroupEnd() == braidSuccess);
  RANK_CHECK(17, braidStreamSynchronize(on.stream) == braidSuccess);
  RANK_CHECK(18, firstWrong(on.recv, kOdd, [&](size_t i) { return value(prev, 0, i); }) == -1);
  return on.releaseTheMemoryLock(r, 19);
}

TEST_F(StagedOnACudaStream, PiecesOfWholeElementsArePinnedAhead) {
  RankSetup setup;
  setup.environment = {"BRAID_CUDA_IPC=0", "BRAID_CHUNK_BYTES=400003"};
  expectEveryRankPassed(runRanks(2, sendRecvInPiecesOfWholeElements, setup));
}

// Ranks 0 and 1 share a host (cuda_ipc), rank 2 has its own.
const char* twoHosts(int rank) {
  return rank < 2 ? "host-a" : "host-b";
}

TEST_F(StagedOnACudaStream, CallsAcrossHostsPinNothingWhileTheStreamWaits) {
  RankSetup setup;
  setup.hostOf = twoHosts;
  expectEveryRankPassed(runRanks(3, stagedCallsPinNothingWhileTheStreamWaits, setup));
}

}  // namespace
