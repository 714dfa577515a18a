// Reads in place among forked ranks on the stand-in driver's one GPU
// (BRAID_CUDA_IPC_DIRECT_BYTES, transports/cuda_ipc/cuda_ipc_connection.h):
// a message at least that large is read by its receiver out of the
// sender's cudaMalloc buffer, so the sender copies nothing into a slot.
// The copy and export counts tell the two ways apart, and every result is
// checked.
#include <gtest/gtest.h>

#include <vector>

#include "braid.h"
#include "gpu_ranks.h"

namespace {

using namespace braid::testing::gpu_ranks;

class GpuDirectReads : public ForkedGpuRanks {};

// A chain Broadcast from the last rank in chunks of up to 64 KiB: the root sends
// every chunk of its block (and copies each into its own recv), the other
// ranks receive each one (and pass it on).
template <bool kReadsInPlace>
int broadcastChecked(Rank& r) {
  float* send = r.allocate(kCount);
  float* recv = r.allocate(kCount);
  RANK_CHECK(10, send != nullptr && recv != nullptr);
  const bool root = r.rank() == r.nranks() - 1;
  Copies copies;
  if (const int failed = broadcastFromTheLastRank(r, send, recv)) return failed;
  RANK_CHECK(13, copies.hostDeviceSince() == 0);
  if (kReadsInPlace) {
    // Read in place: the root exports its buffer (once) and copies only
    // into its own recv; the receiver copies each chunk once.
    if (root) RANK_CHECK(14, copies.exportsSince() >= 1);
    RANK_CHECK(15, copies.deviceSince() <= kChunksPerBlock + 1);
    if (!root) RANK_CHECK(16, copies.deviceSince() >= kChunksPerBlock);
  } else {
    // Through the slots: the root copies each chunk into the peer's slot
    // too, and exports at most its slots, once.
    if (root) RANK_CHECK(17, copies.deviceSince() >= 2 * kChunksPerBlock);
    RANK_CHECK(18, copies.exportsSince() <= 1);
  }
  return 0;
}

// Chunks of 63160 bytes: the block cut into 19 even pieces of at most 64 KiB.
RankSetup withDirectBytes(const char* bytes) {
  RankSetup setup;
  setup.environment = {"BRAID_CUDA_IPC_SLOT_BYTES=64K", "BRAID_ALGO=broadcast=chain",
                       std::string("BRAID_CUDA_IPC_DIRECT_BYTES=") + bytes};
  return setup;
}

TEST_F(GpuDirectReads, AReceiverReadsEachChunkInPlaceAndTheSenderCopiesNone) {
  expectEveryRankPassed(runRanks(2, broadcastChecked<true>, withDirectBytes("32K")));
}

TEST_F(GpuDirectReads, ChunksUnderTheMinimumGoThroughTheSlots) {
  expectEveryRankPassed(runRanks(2, broadcastChecked<false>, withDirectBytes("64K")));
}

TEST_F(GpuDirectReads, ThreeRanksReadInPlaceToo) {
  expectEveryRankPassed(runRanks(3, broadcastChecked<true>, withDirectBytes("1")));
}

TEST_F(GpuDirectReads, ZeroSendsEveryMessageThroughTheSlots) {
  expectEveryRankPassed(runRanks(2, broadcastChecked<false>, withDirectBytes("0")));
}

// braidMemAlloc's memory, with BRAID_CUDA_IPC_DIRECT_BYTES at its default:
// where the GPU exports cuMem memory as descriptors (FAKE_CUDA_VMM=1), a
// peer reads it in place, and nothing is exported per call; the root then
// frees its buffers, which its peer still maps, and a second pair of
// buffers is read in place as well. Without descriptors it is plain GPU
// memory, which goes through the slots. Chunks of 120000 bytes (the block
// cut into 10 even pieces of at most 128 KiB): above the default minimum.
constexpr unsigned long kLargeChunks = 10;

template <bool kDescriptors>
int memAllocBroadcastChecked(Rank& r) {
  const bool root = r.rank() == r.nranks() - 1;
  // cuMem mappings of this process after each round: its own buffers, its
  // slots, and the root's buffers it maps.
  std::vector<unsigned long> maps;
  for (int round = 0; round < 4; ++round) {
    void* send = nullptr;
    void* recv = nullptr;
    RANK_CHECK(20, braidMemAlloc(&send, kCount * sizeof(float)) == braidSuccess);
    RANK_CHECK(21, braidMemAlloc(&recv, kCount * sizeof(float)) == braidSuccess);
    Copies copies;
    if (const int failed =
            broadcastFromTheLastRank(r, static_cast<float*>(send), static_cast<float*>(recv)))
      return failed;
    // No legacy handle but the slots' (exported at the first call).
    RANK_CHECK(22, round == 0 || copies.exportsSince() == 0);
    if (kDescriptors) {
      RANK_CHECK(23, copies.deviceSince() <= kLargeChunks + 1);
      if (!root) RANK_CHECK(24, copies.deviceSince() >= kLargeChunks);
    } else if (root) {
      RANK_CHECK(25, copies.deviceSince() >= 2 * kLargeChunks);
    }
    // Every rank's call is over once the barrier is: the buffers may go.
    RANK_CHECK(26, braidBarrier(r.comm, nullptr) == braidSuccess);
    RANK_CHECK(27, braidMemFree(send) == braidSuccess);
    RANK_CHECK(28, braidMemFree(recv) == braidSuccess);
    RANK_CHECK(29, braidMemFree(recv) == braidInvalidArgument);  // freed already
    maps.push_back(fake.liveVmmMaps());
  }
  // The root's freed buffers are unmapped here once it says so, a call or
  // two later: the mappings do not grow round after round.
  if (kDescriptors && !root) RANK_CHECK(30, maps[3] <= maps[1]);
  return 0;
}

RankSetup withVmm(const char* vmm) {
  RankSetup setup;
  setup.environment = {"BRAID_CHUNK_BYTES=131072", "BRAID_CUDA_IPC_SLOT_BYTES=128K",
                       "BRAID_ALGO=broadcast=chain", std::string("FAKE_CUDA_VMM=") + vmm};
  return setup;
}

TEST_F(GpuDirectReads, BraidMemAllocBuffersAreReadInPlaceByDefaultAndMayBeFreedAnyTime) {
  expectEveryRankPassed(runRanks(2, memAllocBroadcastChecked<true>, withVmm("1")));
}

TEST_F(GpuDirectReads, BraidMemAllocWithoutDescriptorsIsPlainMemoryThroughTheSlots) {
  expectEveryRankPassed(runRanks(2, memAllocBroadcastChecked<false>, withVmm("0")));
}

// cudaMalloc buffers, with BRAID_CUDA_IPC_DIRECT_BYTES at its default.
TEST_F(GpuDirectReads, CudaMallocBuffersGoThroughTheSlotsByDefault) {
  RankSetup setup;
  setup.environment = {"BRAID_CUDA_IPC_SLOT_BYTES=64K", "BRAID_ALGO=broadcast=chain"};
  expectEveryRankPassed(runRanks(2, broadcastChecked<false>, setup));
}

}  // namespace
