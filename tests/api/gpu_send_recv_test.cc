// Send and Recv of GPU buffers run as GPU jobs: above BRAID_CHUNK_BYTES a
// message crosses in pieces of that size, each copied through pinned host
// memory on the GPU's stream while the wire carries the others (eight
// pieces at most), and never staged whole. Host memory crosses in the same pieces, so the two ends
// may hold different kinds of memory. Forked ranks share the stand-in driver's GPU (gpu_ranks.h),
// whose copy counts show how the bytes went: a piece costs one copy out of the GPU at the sender
// and one into it at the receiver; staged whole, the recv would also be copied out first.
#include <gtest/gtest.h>

#include <vector>

#include "braid.h"
#include "gpu_ranks.h"

namespace {

using namespace braid::testing::gpu_ranks;

class GpuSendRecv : public ForkedGpuRanks {};

// Where a rank's block to send and its block to receive live.
struct Ends {
  bool sendOnGpu = true, recvOnGpu = true;
};

// A Send of `count` floats to the next rank and a Recv from the previous one
// in a group (every rank sends first, which only a group makes safe), on
// `stream`; checks what arrived. Returns 0 or the failed step.
int ring(Rank& r, size_t count, Ends ends, braidStream_t stream = nullptr) {
  const int n = r.nranks(), me = r.rank(), next = (me + 1) % n, previous = (me + n - 1) % n;
  std::vector<float> hostSend(count), hostRecv(count);
  float* send = ends.sendOnGpu ? r.allocate(count) : hostSend.data();
  float* recv = ends.recvOnGpu ? r.allocate(count) : hostRecv.data();
  RANK_CHECK(40, send != nullptr && recv != nullptr);
  for (size_t i = 0; i < count; ++i) send[i] = value(me, 2, i);
  for (size_t i = 0; i < count; ++i) recv[i] = -1;
  RANK_CHECK(41, braidGroupStart() == braidSuccess);
  RANK_CHECK(42, braidSend(send, count, braidFloat32, next, r.comm, stream) == braidSuccess);
  RANK_CHECK(43, braidRecv(recv, count, braidFloat32, previous, r.comm, stream) == braidSuccess);
  RANK_CHECK(44, braidGroupEnd() == braidSuccess);
  if (stream != nullptr) RANK_CHECK(45, braidStreamSynchronize(stream) == braidSuccess);
  RANK_CHECK(46, firstWrong(recv, count, [&](size_t i) { return value(previous, 2, i); }) == -1);
  return 0;
}

// A ring of GPU blocks, then the same again with the connections made, then
// a collective over cuda_ipc on the same GPU path.
int gpuRing(Rank& r) {
  for (int round = 0; round < 2; ++round) {
    Copies copies;
    if (const int failed = ring(r, kCount, {})) return failed;
    RANK_CHECK(10, copies.hostDeviceSince() == 2 * sendRecvPieces(kCount));
    RANK_CHECK(11, copies.deviceSince() == 0);
  }
  float* send = r.allocate(kCount);
  float* recv = r.allocate(r.nranks() * kCount);
  RANK_CHECK(12, send != nullptr && recv != nullptr);
  for (size_t i = 0; i < kCount; ++i) send[i] = value(r.rank(), 0, i);
  Copies copies;
  if (const int failed = allGatherChecked(r, send, recv)) return failed;
  EXPECT_GPU_TO_GPU(13, copies);
  return 0;
}

TEST_F(GpuSendRecv, ABlockCrossesInPiecesThroughPinnedMemoryAmongTwoRanks) {
  expectEveryRankPassed(runRanks(2, gpuRing));
}

TEST_F(GpuSendRecv, ABlockCrossesInPiecesThroughPinnedMemoryAmongThreeRanks) {
  expectEveryRankPassed(runRanks(3, gpuRing));
}

int gpuRingBetweenHosts(Rank& r) {
  Copies copies;
  if (const int failed = ring(r, kCount, {})) return failed;
  RANK_CHECK(10, copies.hostDeviceSince() == 2 * sendRecvPieces(kCount));
  return 0;
}

TEST_F(GpuSendRecv, BetweenHostsABlockCrossesInPieces) {
  RankSetup setup;
  setup.hostOf = ownHost;
  expectEveryRankPassed(runRanks(2, gpuRingBetweenHosts, setup));
  expectEveryRankPassed(runRanks(3, gpuRingBetweenHosts, setup));
}

// The sender cannot know what memory the receiver holds: GPU to host and
// host to GPU, each rank with one block on the GPU and one in host memory,
// as blocking calls outside a group.
int mixedKinds(Rank& r) {
  const bool first = r.rank() == 0;
  const int peer = 1 - r.rank();
  std::vector<float> hostBlock(kCount);
  float* gpuBlock = r.allocate(kCount);
  RANK_CHECK(10, gpuBlock != nullptr);
  // Rank 0 sends from the GPU and receives into host memory; rank 1 the
  // other way round.
  float* out = first ? gpuBlock : hostBlock.data();
  float* in = first ? hostBlock.data() : gpuBlock;
  for (size_t i = 0; i < kCount; ++i) out[i] = value(r.rank(), 0, i);
  Copies copies;
  if (first) {
    RANK_CHECK(11, braidSend(out, kCount, braidFloat32, peer, r.comm, nullptr) == braidSuccess);
    for (size_t i = 0; i < kCount; ++i) in[i] = -1;
    RANK_CHECK(12, braidRecv(in, kCount, braidFloat32, peer, r.comm, nullptr) == braidSuccess);
  } else {
    std::vector<float> received(kCount, -1);
    // The block that arrives from rank 0 lands on the GPU, then goes back
    // from host memory.
    RANK_CHECK(13, braidRecv(in, kCount, braidFloat32, peer, r.comm, nullptr) == braidSuccess);
    RANK_CHECK(14, firstWrong(in, kCount, [&](size_t i) { return value(0, 0, i); }) == -1);
    RANK_CHECK(15, braidSend(out, kCount, braidFloat32, peer, r.comm, nullptr) == braidSuccess);
  }
  RANK_CHECK(16, copies.hostDeviceSince() == sendRecvPieces(kCount));
  if (first) RANK_CHECK(17, firstWrong(in, kCount, [&](size_t i) { return value(1, 0, i); }) == -1);
  return 0;
}

TEST_F(GpuSendRecv, GpuMemoryAtOneEndAndHostMemoryAtTheOther) {
  expectEveryRankPassed(runRanks(2, mixedKinds));
}

// The cut depends on the size alone: up to a chunk one piece, a float more
// two (the last of one float), and no more than eight for a larger block.
int piecesBySize(Rank& r) {
  for (const size_t count :
       {size_t{1}, kChunkBytes / sizeof(float), kChunkBytes / sizeof(float) + 1}) {
    Copies copies;
    if (const int failed = ring(r, count, {})) return failed;
    RANK_CHECK(10, copies.hostDeviceSince() == 2 * sendRecvPieces(count));
  }
  return 0;
}

TEST_F(GpuSendRecv, AMessageOfAChunkOrLessIsOnePiece) {
  expectEveryRankPassed(runRanks(2, piecesBySize));
}

// With BRAID_GPU_STAGING=whole they are staged whole: the send copied out
// once, the recv out and back.
int stagedWhole(Rank& r) {
  Copies copies;
  if (const int failed = ring(r, kCount, {})) return failed;
  RANK_CHECK(10, copies.hostDeviceSince() == 3);
  return 0;
}

TEST_F(GpuSendRecv, WithWholeStagingTheyAreStagedWhole) {
  RankSetup setup;
  setup.environment = {"BRAID_GPU_STAGING=whole"};
  expectEveryRankPassed(runRanks(2, stagedWhole, setup));
}

// A GPU Send and a host Send to the same peer in one group, and the Recvs
// that match them: the GPU one's pieces reach the wire only once their
// copies ran, yet the host one, queued after it, must not overtake them.
int gpuThenHostToOnePeer(Rank& r) {
  const int n = r.nranks(), me = r.rank(), next = (me + 1) % n, previous = (me + n - 1) % n;
  float* gpuSend = r.allocate(kCount);
  float* gpuRecv = r.allocate(kCount);
  RANK_CHECK(10, gpuSend != nullptr && gpuRecv != nullptr);
  std::vector<float> hostSend(kCount), hostRecv(kCount, -1);
  for (size_t i = 0; i < kCount; ++i) gpuSend[i] = value(me, 0, i);
  for (size_t i = 0; i < kCount; ++i) gpuRecv[i] = -1;
  for (size_t i = 0; i < kCount; ++i) hostSend[i] = value(me, 1, i);
  RANK_CHECK(11, braidGroupStart() == braidSuccess);
  RANK_CHECK(12, braidSend(gpuSend, kCount, braidFloat32, next, r.comm, nullptr) == braidSuccess);
  RANK_CHECK(
      13, braidSend(hostSend.data(), kCount, braidFloat32, next, r.comm, nullptr) == braidSuccess);
  RANK_CHECK(14,
             braidRecv(gpuRecv, kCount, braidFloat32, previous, r.comm, nullptr) == braidSuccess);
  RANK_CHECK(15, braidRecv(hostRecv.data(), kCount, braidFloat32, previous, r.comm, nullptr) ==
                     braidSuccess);
  RANK_CHECK(16, braidGroupEnd() == braidSuccess);
  RANK_CHECK(17,
             firstWrong(gpuRecv, kCount, [&](size_t i) { return value(previous, 0, i); }) == -1);
  RANK_CHECK(18, firstWrong(hostRecv.data(), kCount,
                            [&](size_t i) { return value(previous, 1, i); }) == -1);
  return 0;
}

TEST_F(GpuSendRecv, AHostSendAfterAGpuSendToTheSamePeerDoesNotOvertakeIt) {
  expectEveryRankPassed(runRanks(2, gpuThenHostToOnePeer));
  RankSetup setup;
  setup.hostOf = ownHost;
  expectEveryRankPassed(runRanks(3, gpuThenHostToOnePeer, setup));
}

// On a braid stream: the calls return at once and run on the stream's
// thread, after the work queued on the GPU before them.
int gpuRingOnABraidStream(Rank& r) {
  braidStream_t stream = nullptr;
  RANK_CHECK(10, braidStreamCreate(r.comm, &stream) == braidSuccess);
  Copies copies;
  if (const int failed = ring(r, kCount, {}, stream)) return failed;
  RANK_CHECK(11, copies.hostDeviceSince() == 2 * sendRecvPieces(kCount));
  RANK_CHECK(12, braidStreamDestroy(stream) == braidSuccess);
  return 0;
}

TEST_F(GpuSendRecv, OnABraidStream) {
  expectEveryRankPassed(runRanks(2, gpuRingOnABraidStream));
}

// A Recv of fewer elements than were sent fails, naming the call, and
// neither rank is left waiting: the Send returns too, done where the
// transport took its bytes before the receiver said no, else failed.
int countMismatch(Rank& r) {
  float* block = r.allocate(kCount);
  RANK_CHECK(10, block != nullptr);
  for (size_t i = 0; i < kCount; ++i) block[i] = value(r.rank(), 0, i);
  r.broken = true;
  if (r.rank() == 0) {
    const braidResult_t sent = braidSend(block, kCount, braidFloat32, 1, r.comm, nullptr);
    RANK_CHECK(11, sent == braidSuccess || sent == braidInvalidUsage || sent == braidRemoteError);
  } else {
    RANK_CHECK(12,
               braidRecv(block, kCount / 2, braidFloat32, 0, r.comm, nullptr) == braidInvalidUsage);
    RANK_CHECK(13, std::string(braidGetLastError(r.comm)).find("braidRecv") != std::string::npos);
  }
  return 0;
}

TEST_F(GpuSendRecv, ARecvOfAnotherCountFailsAndNeitherRankHangs) {
  expectEveryRankPassed(runRanks(2, countMismatch));
}

}  // namespace
