// The order in which calls on CUDA streams take their holds (gates) on the
// CUDA stream and queue their tasks: the same on every rank, and the same
// for a braid stream's tasks as for its gates, whichever threads call.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "braid.h"
#include "cuda_stream_fixtures.h"
#include "expect_braid.h"

namespace {

using namespace braid::testing::cuda_stream;

#ifdef BRAID_TEST_STAGING

// One rank of two with two braid streams, A and B, made from one CUDA
// stream, and one group that calls AllReduce on A, then on B. Where
// `invert`, B's braid stream is made to sit below A's in memory (its
// allocation takes a hole left below A's): a group that held the CUDA
// stream in the order of the streams' addresses held B's gate first here
// and A's first on the other rank, and each rank's call waited behind
// the other's. Returns 0, or the step that failed.
int twoStreamsOfOneCudaStream(const braidUniqueId& id, int rank, bool invert) {
  static float gpu[16];
  fake.setDeviceRange(gpu, sizeof(gpu), 0, 0);
  void* cudaStream = fake.makeStream();
  if (cudaStream == nullptr) return 10;
  braidComm_t comm = nullptr;
  if (braidCommInitRank(&comm, 2, id, rank) != braidSuccess) return 11;
  std::vector<void*> holes;
  if (invert)
    for (int round = 0; round < 3; ++round)
      for (size_t bytes = 24; bytes <= 2048; bytes += 8) holes.push_back(std::malloc(bytes));
  braidStream_t a = nullptr, b = nullptr;
  if (braidStreamCreateFromCuda(comm, cudaStream, &a) != braidSuccess) return 12;
  for (void* hole : holes) std::free(hole);
  if (braidStreamCreateFromCuda(comm, cudaStream, &b) != braidSuccess) return 13;
  float inA[4] = {1, 1, 1, 1}, outA[4] = {}, inB[4] = {2, 2, 2, 2}, outB[4] = {};
  if (braidGroupStart() != braidSuccess) return 14;
  if (braidAllReduce(inA, outA, 4, braidFloat32, braidSum, comm, a) != braidSuccess) return 15;
  if (braidAllReduce(inB, outB, 4, braidFloat32, braidSum, comm, b) != braidSuccess) return 16;
  if (braidGroupEnd() != braidSuccess) return 17;
  if (braidStreamSynchronize(a) != braidSuccess || braidStreamSynchronize(b) != braidSuccess)
    return 18;
  if (outA[0] != 2.0f || outB[3] != 4.0f) return 19;
  if (braidStreamDestroy(a) != braidSuccess || braidStreamDestroy(b) != braidSuccess) return 20;
  if (braidCommDestroy(comm) != braidSuccess) return 21;
  if (fake.streamDestroy(cudaStream) != 0) return 22;
  return 0;
}

// Both ranks forked, and first in this process, so that neither inherits
// threads of the stand-in driver (a mutex one holds stays held in a child).
TEST_F(CudaStream, AGroupOnTwoBraidStreamsOfOneCudaStreamHoldsItInCallOrderOnEveryRank) {
  for (const bool invertOnRankOne : {false, true}) {
    SCOPED_TRACE(invertOnRankOne ? "B below A on rank 1" : "as allocated");
    braidUniqueId id;
    ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
    pid_t ranks[2];
    for (int rank = 0; rank < 2; ++rank) {
      ranks[rank] = fork();
      ASSERT_GE(ranks[rank], 0);
      if (ranks[rank] == 0) {
        setenv("BRAID_TIMEOUT", "10", 1);
        _exit(twoStreamsOfOneCudaStream(id, rank, invertOnRankOne && rank == 1));
      }
    }
    for (int rank = 0; rank < 2; ++rank) {
      int status = 0;
      ASSERT_EQ(waitpid(ranks[rank], &status, 0), ranks[rank]);
      ASSERT_TRUE(WIFEXITED(status));
      EXPECT_EQ(WEXITSTATUS(status), 0) << "rank " << rank << " failed at that step";
    }
  }
}

// Two threads calling on one braid stream of a CUDA stream: each call's
// task is queued in the order of its gate, or the stream's thread waits
// for a gate that a task queued behind it would let go.
TEST_F(OneRankOnACudaStream, TwoThreadsCallingOnOneBraidStreamKeepTheirGatesInOrder) {
  constexpr int kCalls = 500;
  auto calls = [&] {
    float in[4] = {1, 1, 1, 1}, out[4] = {};
    for (int i = 0; i < kCalls; ++i)
      if (braidAllReduce(in, out, 4, braidFloat32, braidSum, comm_, stream_) != braidSuccess)
        return;
  };
  setenv("BRAID_TIMEOUT", "5", 1);
  std::thread first(calls), second(calls);
  first.join();
  second.join();
  unsetenv("BRAID_TIMEOUT");
  EXPECT_BRAID_OK(braidStreamSynchronize(stream_));
  EXPECT_EQ(fake.streamSynchronize(cudaStream_), 0);
}

// A call whose staging cannot allocate its host copy fails through the
// stream (braidSystemError), as it would on stream NULL, and the CUDA
// stream goes on; it never ends the process.
TEST_F(OneRankOnACudaStream, AStagedCallThatCannotAllocateFailsItsStreamNotTheProcess) {
  static float gpu[16];
  fake.setDeviceRange(gpu, sizeof(gpu), 0, 0);
  // Memory of a pool, whose range braid does not check against the count
  // (memory of cudaMalloc would be refused at the call).
  fake.setLegacyIpcCapable(0);
  // In place, 2^44 floats: 64 TiB of host memory to stage through.
  EXPECT_BRAID_OK(
      braidAllReduce(gpu, gpu, size_t{1} << 44, braidFloat32, braidSum, comm_, stream_));
  fake.setLegacyIpcCapable(1);
  EXPECT_EQ(braidStreamSynchronize(stream_), braidSystemError);
  EXPECT_EQ(fake.streamSynchronize(cudaStream_), 0);
  aborted_ = true;
}

// A staged call whose copies never run (braid's copy stream behind the
// held CUDA stream in one hardware queue, say) fails at BRAID_TIMEOUT, and
// the CUDA stream goes on, rather than hang the stream's thread, and with
// it braidStreamSynchronize, braidStreamDestroy and braidCommDestroy.
TEST_F(OneRankOnACudaStream, AStagedCallWhoseCopiesNeverRunFailsAtTheTimeout) {
  static float gpu[1024];
  fake.setDeviceRange(gpu, sizeof(gpu), 0, 0);
  setenv("BRAID_TIMEOUT", "1", 1);
  braidComm_t comm = oneRank();  // with that timeout
  unsetenv("BRAID_TIMEOUT");
  ASSERT_NE(comm, nullptr);
  braidStream_t stream = nullptr;
  ASSERT_EQ(braidStreamCreateFromCuda(comm, cudaStream_, &stream), braidSuccess);
  fake.stallCopies(1);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_BRAID_OK(braidAllReduce(gpu, gpu + 512, 512, braidFloat32, braidSum, comm, stream));
  EXPECT_EQ(braidStreamSynchronize(stream), braidTimeout) << braidGetLastError(nullptr);
  EXPECT_EQ(fake.streamSynchronize(cudaStream_), 0);  // the CUDA stream went on
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  fake.stallCopies(0);
  EXPECT_BRAID_OK(braidStreamDestroy(stream));
  EXPECT_BRAID_OK(braidCommAbort(comm));
}

// An abort while a call waits for its CUDA stream to reach it (work queued
// before it still runs) ends the wait, rather than hold the braid stream,
// and braidCommDestroy, until BRAID_TIMEOUT.
TEST_F(OneRankOnACudaStream, AnAbortEndsTheWaitForTheCudaStream) {
  setenv("BRAID_TIMEOUT", "30", 1);
  braidComm_t comm = oneRank();
  unsetenv("BRAID_TIMEOUT");
  ASSERT_NE(comm, nullptr);
  braidStream_t stream = nullptr;
  ASSERT_EQ(braidStreamCreateFromCuda(comm, cudaStream_, &stream), braidSuccess);
  braid::testing::Gate gate;  // the work queued before the call, still running
  ASSERT_EQ(fake.launchKernel(cudaStream_, braid::testing::Gate::run, &gate), 0);
  float x[4] = {1, 2, 3, 4};
  EXPECT_BRAID_OK(braidAllReduce(x, x, 4, braidFloat32, braidSum, comm, stream));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the call waits
  const auto start = std::chrono::steady_clock::now();
  EXPECT_BRAID_OK(braidCommAbort(comm));
  EXPECT_EQ(braidStreamSynchronize(stream), braidInvalidUsage) << braidGetLastError(nullptr);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  gate.open.store(true);
  EXPECT_EQ(fake.streamSynchronize(cudaStream_), 0);  // and the CUDA stream goes on
  EXPECT_BRAID_OK(braidStreamDestroy(stream));
  EXPECT_BRAID_OK(braidCommDestroy(comm));
}

#endif

// Streams made and destroyed at once, many times: the stream's thread
// must never miss the destroy's wake-up.
TEST_F(CudaStream, StreamsMadeAndDestroyedAtOnceNeverHang) {
  // A communicator numbers at most 125 streams in its life.
  for (int round = 0; round < 25; ++round) {
    braidComm_t comm = oneRank();
    ASSERT_NE(comm, nullptr);
    for (int i = 0; i < 120; ++i) {
      braidStream_t stream = nullptr;
      ASSERT_EQ(braidStreamCreate(comm, &stream), braidSuccess) << braidGetLastError(nullptr);
      ASSERT_EQ(braidStreamDestroy(stream), braidSuccess) << braidGetLastError(nullptr);
    }
    EXPECT_BRAID_OK(braidCommDestroy(comm));
  }
}

}  // namespace
