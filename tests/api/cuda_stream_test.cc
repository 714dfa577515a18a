// Calls on a CUDA stream (braidStreamCreateFromCuda), against the stand-in
// CUDA driver (tests/unit/fake_libcuda.c, path in FAKE_LIBCUDA), whose
// streams are threads that run their work in order: "kernels" the test
// queues (fakeCudaLaunchKernel), host functions, waits for a value. A call
// must be enqueued after the work already on the stream, return at once,
// and finish before the work queued after it starts; a faulted stream's
// error comes back as braidUnhandledCudaError with CUDA's message. The
// stand-in refuses (instead of hanging) a copy or a wait for the context
// while a stream waits for a value the host has not written, which is how
// staging that waited for the whole context would deadlock on a GPU.
// Without CUDA in the build, braidStreamCreateFromCuda is refused.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../unit/fake_gpu_work.h"
#include "../unit/fake_libcuda_loader.h"
#include "braid.h"
#include "cuda_stream_fixtures.h"
#include "expect_braid.h"

namespace {

using namespace braid::testing::cuda_stream;

#ifdef BRAID_TEST_STAGING

// A rank of two with its "GPU memory", a CUDA stream of the stand-in, and
// a braid stream on it.
struct RankOnACudaStream {
  void* cudaStream = nullptr;
  braidComm_t comm = nullptr;
  braidStream_t stream = nullptr;

  // Returns 0, or the step that failed (10 to 12).
  int join(const braidUniqueId& id, int rank, void* gpu, size_t gpuBytes) {
    fake.setDeviceRange(gpu, gpuBytes, 0, 0);
    cudaStream = fake.makeStream();
    if (cudaStream == nullptr) return 10;
    if (braidCommInitRank(&comm, 2, id, rank) != braidSuccess) return 11;
    if (braidStreamCreateFromCuda(comm, cudaStream, &stream) != braidSuccess) return 12;
    return 0;
  }
};

// One rank of two, in its own process: its "GPU memory" is `gpu`. Returns 0,
// or the step that failed.
int orderedRank(const braidUniqueId& id, int rank) {
  constexpr int kCount = 64;
  static float gpu[3 * kCount];  // send, recv, and the in-place buffer
  float* send = gpu;
  float* recv = gpu + kCount;
  float* inPlace = gpu + 2 * kCount;
  RankOnACudaStream r;
  if (const int failed = r.join(id, rank, gpu, sizeof(gpu))) return failed;
  void* cudaStream = r.cudaStream;
  braidComm_t comm = r.comm;
  braidStream_t stream = r.stream;

  // Work before: the inputs are written 100 ms after the call is made.
  for (int i = 0; i < kCount; ++i) send[i] = -1.0f;
  SlowFill fill{send, kCount, static_cast<float>(100 * rank)};
  HeldFill hold(fill);
  if (fake.launchKernel(cudaStream, SlowFill::run, &fill) != 0) return 13;
  const unsigned long copiesBefore = fake.copyCount();
  if (braidAllReduce(send, recv, kCount, braidFloat32, braidSum, comm, stream) != braidSuccess)
    return 14;
  if (fill.done.load()) return 15;  // the call waited for the work before it
  hold.release();
  // Work after: reads the result.
  float seen[kCount] = {};
  Snapshot snapshot{recv, seen, kCount};
  if (fake.launchKernel(cudaStream, Snapshot::run, &snapshot) != 0) return 16;

  // Many calls in a row, each between two pieces of work: x = 2 (x + 1).
  for (int i = 0; i < kCount; ++i) inPlace[i] = static_cast<float>(i);
  AddOne addOne{inPlace, kCount};
  for (int round = 0; round < 5; ++round) {
    if (fake.launchKernel(cudaStream, AddOne::run, &addOne) != 0) return 17;
    if (braidAllReduce(inPlace, inPlace, kCount, braidFloat32, braidSum, comm, stream) !=
        braidSuccess)
      return 18;
  }
  if (fake.streamSynchronize(cudaStream) != 0) return 19;
  if (braidStreamSynchronize(stream) != braidSuccess) return 20;
  for (int i = 0; i < kCount; ++i)
    if (seen[i] != 100.0f + 2.0f * static_cast<float>(i)) return 21;  // (0 + i) + (100 + i)
  for (int i = 0; i < kCount; ++i) {
    float x = static_cast<float>(i);
    for (int round = 0; round < 5; ++round) x = 2 * (x + 1);
    if (inPlace[i] != x) return 22;
  }
  // The GPU buffers went through the driver's copies, not read in place.
  if (fake.copyCount() - copiesBefore < 2 + 5 * 2) return 23;
  braidResult_t async = braidSuccess;
  if (braidCommGetAsyncError(comm, &async) != braidSuccess || async != braidSuccess) return 24;
  if (braidStreamDestroy(stream) != braidSuccess) return 25;
  if (braidCommDestroy(comm) != braidSuccess) return 26;
  if (fake.streamDestroy(cudaStream) != 0) return 27;
  return 0;
}

// Runs `body` as rank 1 in a forked process and as rank 0 here, of one
// communicator; each returns 0 or the step that failed.
void expectTwoRanksPass(int (*body)(const braidUniqueId& id, int rank)) {
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess) << braidGetLastError(nullptr);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(body(id, 1));
  const int mine = body(id, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(mine, 0) << "rank 0 failed at step " << mine << ": " << braidGetLastError(nullptr);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "rank 1 failed at step " << WEXITSTATUS(status);
}

TEST_F(CudaStream, CallsRunBetweenTheWorkBeforeAndAfterThemWithoutBlockingTheCaller) {
  expectTwoRanksPass(orderedRank);
}

// One rank of two exchanging GPU buffers with Send/Recv in a group on a
// CUDA stream, as data-parallel frameworks batch their point-to-point
// calls: each sends first, which only a group makes safe. Returns 0, or the
// step that failed.
int exchangeRank(const braidUniqueId& id, int rank) {
  constexpr int kCount = 4096;
  static float gpu[2 * kCount];
  float* send = gpu;
  float* recv = gpu + kCount;
  RankOnACudaStream r;
  if (const int failed = r.join(id, rank, gpu, sizeof(gpu))) return failed;
  void* cudaStream = r.cudaStream;
  braidComm_t comm = r.comm;
  braidStream_t stream = r.stream;
  for (int i = 0; i < kCount; ++i) send[i] = recv[i] = -1.0f;
  SlowFill fill{send, kCount, static_cast<float>(10000 * (rank + 1))};
  HeldFill hold(fill);
  if (fake.launchKernel(cudaStream, SlowFill::run, &fill) != 0) return 13;
  const int peer = 1 - rank;
  if (braidGroupStart() != braidSuccess) return 14;
  if (braidSend(send, kCount, braidFloat32, peer, comm, stream) != braidSuccess) return 15;
  if (braidRecv(recv, kCount, braidFloat32, peer, comm, stream) != braidSuccess) return 16;
  if (braidGroupEnd() != braidSuccess) return 17;
  if (fill.done.load()) return 18;  // braidGroupEnd returned at once
  hold.release();
  static float seen[kCount];
  Snapshot snapshot{recv, seen, kCount};
  if (fake.launchKernel(cudaStream, Snapshot::run, &snapshot) != 0) return 19;
  if (fake.streamSynchronize(cudaStream) != 0) return 20;
  if (braidStreamSynchronize(stream) != braidSuccess) return 21;
  for (int i = 0; i < kCount; ++i)
    if (seen[i] != static_cast<float>(10000 * (peer + 1) + i)) return 22;
  if (braidStreamDestroy(stream) != braidSuccess) return 23;
  if (braidCommDestroy(comm) != braidSuccess) return 24;
  if (fake.streamDestroy(cudaStream) != 0) return 25;
  return 0;
}

TEST_F(CudaStream, TwoRanksExchangeGpuBuffersInAGroupOnTheirCudaStreams) {
  expectTwoRanksPass(exchangeRank);
}

// One rank, a CUDA stream of the stand-in, and a braid stream on it.
TEST_F(OneRankOnACudaStream, HostBuffersAreOrderedToo) {
  expectAnAllReduceInOrder(comm_, stream_, cudaStream_);
}

TEST_F(OneRankOnACudaStream, AFaultedStreamFailsTheCallWithCudasMessageAndDoesNotHang) {
  float x = 1.0f, y = 0.0f;
  fake.failStream(cudaStream_);  // a kernel before the call faulted
  EXPECT_BRAID_OK(braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm_, stream_));
  EXPECT_BRAID_ERROR(braidStreamSynchronize(stream_), braidUnhandledCudaError,
                     "an illegal memory access was encountered", "CUDA error 700");
  braidResult_t async = braidSuccess;
  EXPECT_BRAID_OK(braidCommGetAsyncError(comm_, &async));
  EXPECT_EQ(async, braidUnhandledCudaError);
  EXPECT_EQ(y, 0.0f);  // the call did not run
  aborted_ = true;
}

// The legacy default stream (0), which the driver resolves against the
// context current on the calling thread, orders calls as a stream of
// cudaStreamCreate does: braid enters that context on its own thread, where
// none is current.
TEST_F(CudaStream, TheLegacyDefaultStreamOrdersCallsToo) {
  braidComm_t comm = oneRank();
  ASSERT_NE(comm, nullptr) << braidGetLastError(nullptr);
  void* created = fake.makeStream();  // and a context current on this thread
  ASSERT_NE(created, nullptr);
  braidStream_t stream = nullptr;
  EXPECT_BRAID_OK(braidStreamCreateFromCuda(comm, nullptr, &stream));
  expectAnAllReduceInOrder(comm, stream, nullptr);
  EXPECT_BRAID_OK(braidStreamDestroy(stream));
  EXPECT_BRAID_OK(braidCommDestroy(comm));
  EXPECT_EQ(fake.streamDestroy(created), 0);
}

// cudaStreamPerThread names another stream on every thread, braid's among
// them: refused at once, naming what to pass instead.
TEST_F(CudaStream, ThePerThreadDefaultStreamIsRefused) {
  braidComm_t comm = oneRank();
  ASSERT_NE(comm, nullptr) << braidGetLastError(nullptr);
  braidStream_t stream = nullptr;
  EXPECT_BRAID_ERROR(braidStreamCreateFromCuda(comm, reinterpret_cast<void*>(0x2), &stream),
                     braidInvalidArgument, "cudaStreamPerThread", "cudaStreamCreate");
  EXPECT_EQ(stream, nullptr);
  EXPECT_BRAID_OK(braidCommDestroy(comm));
}

// A call that fails while the CUDA stream is still busy (here: its wait for
// the work before it times out) lets the calls queued behind it go at once,
// so the release word jumps past the value the stream's first wait is for.
// The waits pass at "at least their value", never "equal": the CUDA stream
// finishes rather than hanging at the first wait, whose value it never sees.
TEST_F(OneRankOnACudaStream, CallsReleasedAtOnceAfterAFailureNeverHoldTheCudaStream) {
  float data[8] = {}, out[8] = {};
  SlowFill fill{data, 8, 1.0f};
  HeldFill hold(fill);
  ASSERT_EQ(fake.launchKernel(cudaStream_, SlowFill::run, &fill), 0);
  EXPECT_BRAID_OK(braidCommSetTimeout(comm_, 0.02));
  for (int call = 0; call < 3; ++call)
    EXPECT_BRAID_OK(braidAllReduce(data, out, 8, braidFloat32, braidSum, comm_, stream_));
  // Held ten times the calls' timeout after they were made, at the least.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  hold.release();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int state = fake.streamQuery(cudaStream_);
  while (state != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    state = fake.streamQuery(cudaStream_);
  }
  EXPECT_EQ(state, 0) << "the CUDA stream still waits 5 s after the calls were released";
  EXPECT_TRUE(fill.done.load());
  EXPECT_BRAID_ERROR(braidStreamSynchronize(stream_), braidTimeout, "did not reach the call");
  aborted_ = true;
}

// A braid stream destroyed while its CUDA stream has not yet run the wait
// of its last call (here held by earlier work; the call gave up waiting)
// leaves the word that wait reads allocated, rather than free it under the
// GPU.
TEST_F(OneRankOnACudaStream, DestroyingAStreamNeverFreesTheWordAWaitStillReads) {
  braidStream_t second = nullptr;
  ASSERT_EQ(braidStreamCreateFromCuda(comm_, cudaStream_, &second), braidSuccess)
      << braidGetLastError(nullptr);
  braid::testing::Gate gate;
  ASSERT_EQ(fake.launchKernel(cudaStream_, braid::testing::Gate::run, &gate), 0);
  EXPECT_BRAID_OK(braidCommSetTimeout(comm_, 0.02));
  float x = 1.0f, y = 0.0f;
  EXPECT_BRAID_OK(braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm_, second));
  const unsigned long before = fake.freedWhileWaited();
  EXPECT_BRAID_OK(braidStreamDestroy(second));
  EXPECT_EQ(fake.freedWhileWaited(), before) << "the wait's word was freed while it was queued";
  gate.open.store(true);
  ASSERT_EQ(fake.streamSynchronize(cudaStream_), 0);
  aborted_ = true;
}

// A group's calls on a CUDA stream run when the stream reaches the point of
// braidGroupEnd: after the work queued before it, and before the work
// queued after it; GPU buffers are staged around the whole group.
TEST_F(OneRankOnACudaStream, AGroupRunsAtItsEndBetweenTheWorkBeforeAndAfterIt) {
  constexpr int kCount = 16;
  static float gpu[3 * kCount];
  float* source = gpu;
  float* target = gpu + kCount;
  float* reduced = gpu + 2 * kCount;
  fake.setDeviceRange(gpu, sizeof(gpu), 0, 0);
  for (int i = 0; i < kCount; ++i) {
    source[i] = -1.0f;
    target[i] = -2.0f;
    reduced[i] = 100.0f + static_cast<float>(i);
  }
  float host[kCount] = {}, hostIn[kCount];
  for (int i = 0; i < kCount; ++i) hostIn[i] = 3.0f;
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(braidSend(source, kCount, braidFloat32, 0, comm_, stream_));
  EXPECT_BRAID_OK(braidRecv(target, kCount, braidFloat32, 0, comm_, stream_));
  EXPECT_BRAID_OK(braidAllReduce(reduced, reduced, kCount, braidFloat32, braidSum, comm_, stream_));
  EXPECT_BRAID_OK(braidAllReduce(hostIn, host, kCount, braidFloat32, braidSum, comm_, stream_));
  // Work queued after the calls but before the group ends comes before them.
  SlowFill fill{source, kCount, 7.0f};
  HeldFill hold(fill);
  ASSERT_EQ(fake.launchKernel(cudaStream_, SlowFill::run, &fill), 0);
  EXPECT_BRAID_OK(braidGroupEnd());
  EXPECT_FALSE(fill.done.load());  // braidGroupEnd did not wait for it
  hold.release();
  float seenTarget[kCount] = {}, seenHost[kCount] = {};
  Snapshot afterTarget{target, seenTarget, kCount}, afterHost{host, seenHost, kCount};
  ASSERT_EQ(fake.launchKernel(cudaStream_, Snapshot::run, &afterTarget), 0);
  ASSERT_EQ(fake.launchKernel(cudaStream_, Snapshot::run, &afterHost), 0);
  ASSERT_EQ(fake.streamSynchronize(cudaStream_), 0);
  EXPECT_BRAID_OK(braidStreamSynchronize(stream_));
  for (int i = 0; i < kCount; ++i) {
    EXPECT_EQ(seenTarget[i], 7.0f + static_cast<float>(i)) << i;
    EXPECT_EQ(seenHost[i], 3.0f) << i;
    EXPECT_EQ(reduced[i], 100.0f + static_cast<float>(i)) << i;
  }
  fake.setDeviceRange(nullptr, 0, 0, 0);
}

// A failure inside the group comes back from braidStreamSynchronize, and
// the CUDA stream goes on (never left waiting for the group).
TEST_F(OneRankOnACudaStream, AGroupThatFailsLetsTheCudaStreamGoOn) {
  float x[4] = {1, 2, 3, 4}, y[4] = {};
  EXPECT_BRAID_OK(braidGroupStart());
  // A Recv from itself with no matching Send: the group cannot complete.
  EXPECT_BRAID_OK(braidSend(x, 4, braidFloat32, 0, comm_, stream_));
  EXPECT_BRAID_OK(braidRecv(y, 2, braidFloat32, 0, comm_, stream_));
  EXPECT_BRAID_OK(braidGroupEnd());
  ASSERT_EQ(fake.streamSynchronize(cudaStream_), 0);
  EXPECT_NE(braidStreamSynchronize(stream_), braidSuccess);
  aborted_ = true;
}

#else

TEST_F(CudaStream, WithoutCudaInTheBuildItIsRefused) {
  braidComm_t comm = oneRank();
  ASSERT_NE(comm, nullptr) << braidGetLastError(nullptr);
  void* cudaStream = fake.makeStream();
  ASSERT_NE(cudaStream, nullptr);
  braidStream_t stream = nullptr;
  EXPECT_BRAID_ERROR(braidStreamCreateFromCuda(comm, cudaStream, &stream), braidNotSupported,
                     "braidStreamCreateFromCuda", "CUDA");
  EXPECT_EQ(stream, nullptr);
  EXPECT_BRAID_OK(braidCommDestroy(comm));
  EXPECT_EQ(fake.streamDestroy(cudaStream), 0);
}

#endif

}  // namespace
