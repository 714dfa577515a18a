// Group calls (braidGroupStart/End) on GPU buffers: each collective whose
// buffers are device memory of one GPU runs as a GPU job, GPU to GPU over
// cuda_ipc, as it would outside a group; Send and Recv run as GPU jobs too,
// their pieces staged through pinned memory; and all the group's calls still
// run together, so that none waits for another. The same on a
// braid stream, and on a CUDA stream, where the group runs once the CUDA
// stream reaches braidGroupEnd. Forked ranks share the stand-in driver's
// GPU (gpu_ranks.h), whose copy counts tell GPU jobs from staging.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "braid.h"
#include "gpu_ranks.h"

namespace {

using namespace braid::testing::gpu_ranks;

class GpuGroupJobs : public ForkedGpuRanks {};

// The buffers of one group of a Broadcast from the last rank, an AllGather
// and an AllToAll, each call its own (a group's calls may run at once).
struct CopyGroup {
  float *broadcastSend, *broadcastRecv, *gatherSend, *gatherRecv, *allToAllSend, *allToAllRecv;

  bool allocate(Rank& r) {
    const size_t n = r.nranks();
    broadcastSend = r.allocate(kCount);
    broadcastRecv = r.allocate(kCount);
    gatherSend = r.allocate(kCount);
    gatherRecv = r.allocate(n * kCount);
    allToAllSend = r.allocate(n * kCount);
    allToAllRecv = r.allocate(n * kCount);
    return broadcastSend && broadcastRecv && gatherSend && gatherRecv && allToAllSend &&
           allToAllRecv;
  }

  void fill(Rank& r) {
    const int n = r.nranks(), me = r.rank();
    for (size_t i = 0; i < kCount; ++i) broadcastSend[i] = value(me, 0, i);
    for (size_t i = 0; i < kCount; ++i) broadcastRecv[i] = -1;
    for (size_t i = 0; i < kCount; ++i) gatherSend[i] = value(me, 1, i);
    for (size_t i = 0; i < n * kCount; ++i) gatherRecv[i] = -1;
    for (size_t i = 0; i < n * kCount; ++i)
      allToAllSend[i] = value(me, static_cast<int>(i / kCount), i % kCount);
    for (size_t i = 0; i < n * kCount; ++i) allToAllRecv[i] = -1;
  }

  // Queues the three calls in the open group, on `stream`.
  int queue(Rank& r, braidStream_t stream) {
    const int root = r.nranks() - 1;
    RANK_CHECK(20, braidBroadcast(broadcastSend, broadcastRecv, kCount, braidFloat32, root, r.comm,
                                  stream) == braidSuccess);
    RANK_CHECK(21, braidAllGather(gatherSend, gatherRecv, kCount, braidFloat32, r.comm, stream) ==
                       braidSuccess);
    RANK_CHECK(22, braidAllToAll(allToAllSend, allToAllRecv, kCount, braidFloat32, r.comm,
                                 stream) == braidSuccess);
    return 0;
  }

  int check(Rank& r) const {
    const int n = r.nranks(), me = r.rank(), root = n - 1;
    RANK_CHECK(
        30, firstWrong(broadcastRecv, kCount, [&](size_t i) { return value(root, 0, i); }) == -1);
    RANK_CHECK(31, firstWrong(gatherRecv, n * kCount, [&](size_t i) {
                     return value(static_cast<int>(i / kCount), 1, i % kCount);
                   }) == -1);
    RANK_CHECK(32, firstWrong(allToAllRecv, n * kCount, [&](size_t i) {
                     return value(static_cast<int>(i / kCount), me, i % kCount);
                   }) == -1);
    return 0;
  }
};

// Each of the three calls moves at least a block GPU to GPU on every rank.
#define EXPECT_THE_GROUP_GPU_TO_GPU(step, copies)      \
  do {                                                 \
    RANK_CHECK(step, (copies).hostDeviceSince() == 0); \
    RANK_CHECK(step + 1, movedBlocks(copies, 3));      \
  } while (0)

int copyGroup(Rank& r) {
  CopyGroup g;
  RANK_CHECK(10, g.allocate(r));
  for (int round = 0; round < 2; ++round) {  // the second with the connections set up
    g.fill(r);
    Copies copies;
    RANK_CHECK(11, braidGroupStart() == braidSuccess);
    if (const int failed = g.queue(r, nullptr)) return failed;
    RANK_CHECK(12, braidGroupEnd() == braidSuccess);
    if (const int failed = g.check(r)) return failed;
    EXPECT_THE_GROUP_GPU_TO_GPU(13, copies);
  }
  return 0;
}

TEST_F(GpuGroupJobs, CollectivesInAGroupRunAsGpuJobsAmongTwoRanks) {
  expectEveryRankPassed(runRanks(2, copyGroup));
}

TEST_F(GpuGroupJobs, CollectivesInAGroupRunAsGpuJobsAmongThreeRanks) {
  expectEveryRankPassed(runRanks(3, copyGroup));
}

// A group of the three collectives and a Send to the next rank with a Recv
// from the previous one, all on GPU buffers: every rank sends first, so the
// group must run its calls together. The collectives are GPU jobs; the Send
// and Recv are GPU jobs whose pieces go through pinned memory: each piece of
// the send copied out of the GPU once, each piece of the recv into it once
// (staged whole, the recv would also be copied out first).
int copyGroupWithSendRecv(Rank& r, bool oneHost) {
  const int n = r.nranks(), me = r.rank();
  CopyGroup g;
  RANK_CHECK(10, g.allocate(r));
  float* sent = r.allocate(kCount);
  float* received = r.allocate(kCount);
  RANK_CHECK(11, sent != nullptr && received != nullptr);
  g.fill(r);
  for (size_t i = 0; i < kCount; ++i) sent[i] = value(me, 2, i);
  for (size_t i = 0; i < kCount; ++i) received[i] = -1;
  Copies copies;
  RANK_CHECK(12, braidGroupStart() == braidSuccess);
  RANK_CHECK(13,
             braidSend(sent, kCount, braidFloat32, (me + 1) % n, r.comm, nullptr) == braidSuccess);
  if (const int failed = g.queue(r, nullptr)) return failed;
  RANK_CHECK(14, braidRecv(received, kCount, braidFloat32, (me + n - 1) % n, r.comm, nullptr) ==
                     braidSuccess);
  RANK_CHECK(15, braidGroupEnd() == braidSuccess);
  if (const int failed = g.check(r)) return failed;
  const int from = (me + n - 1) % n;
  RANK_CHECK(16, firstWrong(received, kCount, [&](size_t i) { return value(from, 2, i); }) == -1);
  if (!oneHost) return 0;
  RANK_CHECK(17, copies.hostDeviceSince() == 2 * sendRecvPieces(kCount));
  RANK_CHECK(18, movedBlocks(copies, 3));
  return 0;
}

TEST_F(GpuGroupJobs, InAGroupSendAndRecvGoInPiecesThroughPinnedMemoryAndCollectivesGpuToGpu) {
  auto body = [](Rank& r) { return copyGroupWithSendRecv(r, true); };
  expectEveryRankPassed(runRanks(2, body));
  expectEveryRankPassed(runRanks(3, body));
}

// Between hosts the collectives' GPU jobs reach their peers through pinned
// memory, over the same host connections as the Send and Recv, in one run:
// the tags of each connection must still rise.
TEST_F(GpuGroupJobs, BetweenHostsGpuJobsAndStagedCallsOfAGroupShareTheConnections) {
  RankSetup setup;
  setup.hostOf = ownHost;
  auto body = [](Rank& r) { return copyGroupWithSendRecv(r, false); };
  expectEveryRankPassed(runRanks(2, body, setup));
  expectEveryRankPassed(runRanks(3, body, setup));
}

// On a braid stream: the group runs on the stream's thread, after the work
// queued on the GPU before it.
int copyGroupOnABraidStream(Rank& r) {
  CopyGroup g;
  RANK_CHECK(10, g.allocate(r));
  braidStream_t stream = nullptr;
  RANK_CHECK(11, braidStreamCreate(r.comm, &stream) == braidSuccess);
  g.fill(r);
  Copies copies;
  RANK_CHECK(12, braidGroupStart() == braidSuccess);
  if (const int failed = g.queue(r, stream)) return failed;
  RANK_CHECK(13, braidGroupEnd() == braidSuccess);
  RANK_CHECK(14, braidStreamSynchronize(stream) == braidSuccess);
  RANK_CHECK(15, braidStreamDestroy(stream) == braidSuccess);
  if (const int failed = g.check(r)) return failed;
  EXPECT_THE_GROUP_GPU_TO_GPU(16, copies);
  return 0;
}

TEST_F(GpuGroupJobs, OnABraidStreamAGroupRunsAsGpuJobs) {
  expectEveryRankPassed(runRanks(2, copyGroupOnABraidStream));
}

// On a CUDA stream: the inputs are written by a slow "kernel" queued before
// the group, which the group must wait for, and the results are read after
// the CUDA stream passed it.
struct FillBeforeTheGroup {
  CopyGroup* group;
  Rank* rank;
  static void run(void* self) {
    auto* f = static_cast<FillBeforeTheGroup*>(self);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    f->group->fill(*f->rank);
  }
};

int copyGroupOnACudaStream(Rank& r) {
  CopyGroup g;
  RANK_CHECK(10, g.allocate(r));
  void* cudaStream = nullptr;
  RANK_CHECK(11, fake.streamCreate(&cudaStream, 0) == 0);
  braidStream_t stream = nullptr;
  RANK_CHECK(12, braidStreamCreateFromCuda(r.comm, cudaStream, &stream) == braidSuccess);
  FillBeforeTheGroup fill{&g, &r};
  Copies copies;
  RANK_CHECK(13, fake.launchKernel(cudaStream, &FillBeforeTheGroup::run, &fill) == 0);
  RANK_CHECK(14, braidGroupStart() == braidSuccess);
  if (const int failed = g.queue(r, stream)) return failed;
  RANK_CHECK(15, braidGroupEnd() == braidSuccess);
  RANK_CHECK(16, fake.streamSynchronize(cudaStream) == 0);
  RANK_CHECK(17, braidStreamSynchronize(stream) == braidSuccess);
  RANK_CHECK(18, braidStreamDestroy(stream) == braidSuccess);
  if (const int failed = g.check(r)) return failed;
  EXPECT_THE_GROUP_GPU_TO_GPU(19, copies);
  return 0;
}

TEST_F(GpuGroupJobs, OnACudaStreamAGroupRunsAsGpuJobsAfterTheWorkBeforeIt) {
  expectEveryRankPassed(runRanks(2, copyGroupOnACudaStream));
}

}  // namespace
