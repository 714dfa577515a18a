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
#include "expect_braid.h"

namespace {

// The stand-in's entry points the test calls itself.
struct FakeDriver {
  int (*init)(unsigned);
  int (*primaryCtxRetain)(void**, int);
  int (*ctxSetCurrent)(void*);
  int (*streamCreate)(void**, unsigned);
  int (*streamDestroy)(void*);
  int (*streamSynchronize)(void*);
  int (*streamQuery)(void*);
  int (*launchKernel)(void*, void (*)(void*), void*);
  void (*failStream)(void*);
  void (*setDeviceRange)(void*, size_t, int, int);
  unsigned long (*copyCount)();
  unsigned long (*freedWhileWaited)();
  void (*setCapture)(void*, int);
  void (*setGlobalCapture)(int);
  void (*holdMemoryLock)(int);
  unsigned long (*memoryLockRefusals)();

  bool load() {
    void* fake = braid::testing::openFakeLibcuda();
    if (fake == nullptr) return false;
    auto find = [&](auto& entry, const char* name) {
      return braid::testing::findEntry(fake, entry, name);
    };
    return find(init, "cuInit") && find(primaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
           find(ctxSetCurrent, "cuCtxSetCurrent") && find(streamCreate, "cuStreamCreate") &&
           find(streamDestroy, "cuStreamDestroy_v2") &&
           find(streamSynchronize, "cuStreamSynchronize") && find(streamQuery, "cuStreamQuery") &&
           find(launchKernel, "fakeCudaLaunchKernel") && find(failStream, "fakeCudaFailStream") &&
           find(setDeviceRange, "fakeCudaSetDeviceRange") && find(copyCount, "fakeCudaCopyCount") &&
           find(freedWhileWaited, "fakeCudaHostFreedWhileWaited") &&
           find(setCapture, "fakeCudaSetStreamCapture") &&
           find(setGlobalCapture, "fakeCudaSetGlobalCapture") &&
           find(holdMemoryLock, "fakeCudaHoldMemoryLockWhileStreamsWait") &&
           find(memoryLockRefusals, "fakeCudaMemoryLockRefusals");
  }

  // A context current on this thread and a blocking stream (flags 0), as
  // cudaStreamCreate makes: the copies of the legacy stream wait for it.
  void* makeStream() {
    void* context = nullptr;
    void* stream = nullptr;
    if (init(0) != 0 || primaryCtxRetain(&context, 0) != 0 || ctxSetCurrent(context) != 0 ||
        streamCreate(&stream, 0) != 0)
      return nullptr;
    return stream;
  }
};

FakeDriver fake;

class CudaStream : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(fake.load()) << "FAKE_LIBCUDA is not set or not the stand-in (meson sets it)";
    // braid looks for a newly loaded driver at most once a millisecond.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
};

using braid::testing::SlowFill;

// "GPU work" after the call: copies what the call left in `from`.
struct Snapshot {
  const float* from;
  float* to;
  int count;
  static void run(void* self) {
    auto* s = static_cast<Snapshot*>(self);
    for (int i = 0; i < s->count; ++i) s->to[i] = s->from[i];
  }
};

// "GPU work": x = x + 1 on every element.
struct AddOne {
  float* data;
  int count;
  static void run(void* self) {
    auto* a = static_cast<AddOne*>(self);
    for (int i = 0; i < a->count; ++i) a->data[i] += 1.0f;
  }
};

braidComm_t oneRank() {
  braidUniqueId id;
  braidComm_t comm = nullptr;
  if (braidGetUniqueId(&id) != braidSuccess || braidCommInitRank(&comm, 1, id, 0) != braidSuccess)
    return nullptr;
  return comm;
}

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
  if (fake.launchKernel(cudaStream, SlowFill::run, &fill) != 0) return 13;
  const unsigned long copiesBefore = fake.copyCount();
  if (braidAllReduce(send, recv, kCount, braidFloat32, braidSum, comm, stream) != braidSuccess)
    return 14;
  if (fill.done.load()) return 15;  // the call waited for the work before it
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
  if (fake.launchKernel(cudaStream, SlowFill::run, &fill) != 0) return 13;
  const int peer = 1 - rank;
  if (braidGroupStart() != braidSuccess) return 14;
  if (braidSend(send, kCount, braidFloat32, peer, comm, stream) != braidSuccess) return 15;
  if (braidRecv(recv, kCount, braidFloat32, peer, comm, stream) != braidSuccess) return 16;
  if (braidGroupEnd() != braidSuccess) return 17;
  if (fill.done.load()) return 18;  // braidGroupEnd returned at once
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
class OneRankOnACudaStream : public CudaStream {
 protected:
  void SetUp() override {
    comm_ = oneRank();
    ASSERT_NE(comm_, nullptr) << braidGetLastError(nullptr);
    cudaStream_ = fake.makeStream();
    ASSERT_NE(cudaStream_, nullptr);
    ASSERT_EQ(braidStreamCreateFromCuda(comm_, cudaStream_, &stream_), braidSuccess)
        << braidGetLastError(nullptr);
  }
  void TearDown() override {
    EXPECT_BRAID_OK(braidStreamDestroy(stream_));
    if (comm_ != nullptr) {
      EXPECT_BRAID_OK(aborted_ ? braidCommAbort(comm_) : braidCommDestroy(comm_));
    }
    if (cudaStream_ != nullptr) {
      EXPECT_EQ(fake.streamDestroy(cudaStream_), 0);
    }
  }
  braidComm_t comm_ = nullptr;
  void* cudaStream_ = nullptr;
  braidStream_t stream_ = nullptr;
  bool aborted_ = false;  // the communicator failed: abort it rather than destroy it
};

// An AllReduce of host buffers on `stream`, made from `cudaStream`, runs
// after a slow write of its input queued before it, and a read queued after
// it sees the result.
void expectAnAllReduceInOrder(braidComm_t comm, braidStream_t stream, void* cudaStream) {
  float in[16], out[16] = {}, seen[16] = {};
  for (float& x : in) x = -1.0f;
  SlowFill fill{in, 16, 7.0f};
  ASSERT_EQ(fake.launchKernel(cudaStream, SlowFill::run, &fill), 0);
  EXPECT_BRAID_OK(braidAllReduce(in, out, 16, braidFloat32, braidSum, comm, stream));
  Snapshot snapshot{out, seen, 16};
  ASSERT_EQ(fake.launchKernel(cudaStream, Snapshot::run, &snapshot), 0);
  ASSERT_EQ(fake.streamSynchronize(cudaStream), 0);
  EXPECT_BRAID_OK(braidStreamSynchronize(stream));
  EXPECT_EQ(seen[0], 7.0f);
  EXPECT_EQ(seen[15], 22.0f);
}

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
  ASSERT_EQ(fake.launchKernel(cudaStream_, SlowFill::run, &fill), 0);
  EXPECT_BRAID_OK(braidCommSetTimeout(comm_, 0.02));
  for (int call = 0; call < 3; ++call)
    EXPECT_BRAID_OK(braidAllReduce(data, out, 8, braidFloat32, braidSum, comm_, stream_));
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
  ASSERT_EQ(fake.launchKernel(cudaStream_, SlowFill::run, &fill), 0);
  EXPECT_BRAID_OK(braidGroupEnd());
  EXPECT_FALSE(fill.done.load());  // braidGroupEnd did not wait for it
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

// While a CUDA stream waits for a call, an application thread may sit in a
// copy to pageable memory queued after the call (tensor.cpu()), holding the
// driver's memory lock until the stream gets there. A call staged through
// host memory must then take no such lock on braid's thread: its copies go
// through pinned memory made with the stream, never to or from pageable
// memory, nor through memory allocated during the call. Buffers of several
// times the pinned memory, alone and in a group.
TEST_F(OneRankOnACudaStream, StagingTakesNoMemoryLockWhileTheStreamWaits) {
  constexpr int kEveryCallThatTakesTheLock = 1 | 2 | 4;  // FAKE_LOCK_* of the stand-in
  constexpr size_t kCount = (size_t{9} << 20) / sizeof(float) + 3;
  std::vector<float> gpu(4 * kCount);
  fake.setDeviceRange(gpu.data(), gpu.size() * sizeof(float), 0, 0);
  for (size_t i = 0; i < kCount; ++i) gpu[i] = static_cast<float>(i % 1000);
  const unsigned long refusedBefore = fake.memoryLockRefusals();
  fake.holdMemoryLock(kEveryCallThatTakesTheLock);
  EXPECT_BRAID_OK(braidAllReduce(gpu.data(), gpu.data() + kCount, kCount, braidFloat32, braidSum,
                                 comm_, stream_));
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(
      braidBroadcast(gpu.data(), gpu.data() + 2 * kCount, kCount, braidFloat32, 0, comm_, stream_));
  EXPECT_BRAID_OK(
      braidAllGather(gpu.data(), gpu.data() + 3 * kCount, kCount, braidFloat32, comm_, stream_));
  EXPECT_BRAID_OK(braidGroupEnd());
  EXPECT_BRAID_OK(braidStreamSynchronize(stream_));
  ASSERT_EQ(fake.streamSynchronize(cudaStream_), 0);
  fake.holdMemoryLock(0);
  EXPECT_EQ(fake.memoryLockRefusals() - refusedBefore, 0u);
  for (size_t i = 0; i < kCount; i += 4099) {
    ASSERT_EQ(gpu[kCount + i], static_cast<float>(i % 1000)) << i;
    ASSERT_EQ(gpu[2 * kCount + i], static_cast<float>(i % 1000)) << i;
    ASSERT_EQ(gpu[3 * kCount + i], static_cast<float>(i % 1000)) << i;
  }
  EXPECT_EQ(gpu[2 * kCount - 1], gpu[kCount - 1]);
  EXPECT_EQ(gpu[4 * kCount - 1], gpu[kCount - 1]);
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

// A stream that captures a CUDA graph would record the call's signal and
// wait instead of running them: the call is refused at once, and nothing is
// left on the stream.
TEST_F(OneRankOnACudaStream, ACallOnAStreamThatCapturesAGraphIsRefused) {
  float x[4] = {1, 2, 3, 4}, y[4] = {};
  fake.setCapture(cudaStream_, 1);  // CU_STREAM_CAPTURE_STATUS_ACTIVE
  EXPECT_BRAID_ERROR(braidAllReduce(x, y, 4, braidFloat32, braidSum, comm_, stream_),
                     braidNotSupported, "capturing a CUDA graph", "outside the capture");
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(braidAllReduce(x, y, 4, braidFloat32, braidSum, comm_, stream_));
  EXPECT_BRAID_ERROR(braidGroupEnd(), braidNotSupported, "capturing a CUDA graph");
  fake.setCapture(cudaStream_, 0);
  ASSERT_EQ(fake.streamSynchronize(cudaStream_), 0);
  EXPECT_BRAID_OK(braidStreamSynchronize(stream_));
  EXPECT_EQ(y[0], 0.0f);  // neither ran
  expectAnAllReduceInOrder(comm_, stream_, cudaStream_);
}

// A group refused at braidGroupEnd (one of its streams captures a graph)
// runs none of its calls, on any of its streams: a call that ran on one rank
// alone would leave its peers waiting. The streams' batches are queued in
// an order that depends on where the streams were allocated, so the group
// has calls on several plain streams and several streams of the capturing
// CUDA stream, made in turn.
TEST_F(OneRankOnACudaStream, AGroupRefusedAtItsEndRunsNoneOfItsCalls) {
  constexpr int kStreams = 6;
  braidStream_t plain[kStreams] = {}, held[kStreams] = {};
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_EQ(braidStreamCreate(comm_, &plain[i]), braidSuccess) << braidGetLastError(nullptr);
    ASSERT_EQ(braidStreamCreateFromCuda(comm_, cudaStream_, &held[i]), braidSuccess)
        << braidGetLastError(nullptr);
  }
  float x[4] = {1, 2, 3, 4}, out[2 * kStreams][4] = {};
  fake.setCapture(cudaStream_, 1);
  EXPECT_BRAID_OK(braidGroupStart());
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_BRAID_OK(braidAllReduce(x, out[2 * i], 4, braidFloat32, braidSum, comm_, plain[i]));
    EXPECT_BRAID_OK(braidAllReduce(x, out[2 * i + 1], 4, braidFloat32, braidSum, comm_, held[i]));
  }
  EXPECT_BRAID_ERROR(braidGroupEnd(), braidNotSupported, "capturing a CUDA graph");
  fake.setCapture(cudaStream_, 0);
  ASSERT_EQ(fake.streamSynchronize(cudaStream_), 0);
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_BRAID_OK(braidStreamSynchronize(plain[i]));
    EXPECT_BRAID_OK(braidStreamSynchronize(held[i]));
  }
  for (int k = 0; k < 2 * kStreams; ++k) EXPECT_EQ(out[k][0], 0.0f) << "call " << k << " ran";
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_BRAID_OK(braidStreamDestroy(plain[i]));
    EXPECT_BRAID_OK(braidStreamDestroy(held[i]));
  }
  // The CUDA stream goes on, its calls in order.
  expectAnAllReduceInOrder(comm_, stream_, cudaStream_);
}

// While another thread captures a CUDA graph in global mode, the driver
// refuses allocations, queries and synchronizations on threads whose mode is
// global: braid's are made in relaxed mode, so a braid stream on a CUDA
// stream is made, and calls of GPU buffers run on it and on the caller's
// thread (staged through host memory, with one rank), as at any other time.
TEST_F(CudaStream, CallsOfGpuBuffersRunWhileAnotherThreadCapturesAGraph) {
  braidComm_t comm = oneRank();
  ASSERT_NE(comm, nullptr) << braidGetLastError(nullptr);
  void* cudaStream = fake.makeStream();
  ASSERT_NE(cudaStream, nullptr);
  static float gpu[12];
  fake.setDeviceRange(gpu, sizeof(gpu), 0, 0);
  for (int i = 0; i < 12; ++i) gpu[i] = i < 4 ? static_cast<float>(i + 1) : 0.0f;
  fake.setGlobalCapture(1);
  braidStream_t stream = nullptr;
  EXPECT_BRAID_OK(braidStreamCreateFromCuda(comm, cudaStream, &stream));
  EXPECT_BRAID_OK(braidAllReduce(gpu, gpu + 4, 4, braidFloat32, braidSum, comm, stream));
  EXPECT_BRAID_OK(braidStreamSynchronize(stream));
  EXPECT_BRAID_OK(braidAllReduce(gpu, gpu + 8, 4, braidFloat32, braidSum, comm, nullptr));
  fake.setGlobalCapture(0);
  ASSERT_EQ(fake.streamSynchronize(cudaStream), 0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(gpu[4 + i], static_cast<float>(i + 1));
    EXPECT_EQ(gpu[8 + i], static_cast<float>(i + 1));
  }
  fake.setDeviceRange(nullptr, 0, 0, 0);
  EXPECT_BRAID_OK(braidStreamDestroy(stream));
  EXPECT_BRAID_OK(braidCommDestroy(comm));
  EXPECT_EQ(fake.streamDestroy(cudaStream), 0);
}

// With CUDA_DEVICE_MAX_CONNECTIONS=1 every CUDA stream shares one hardware
// queue, where the stream's wait for the call would hold braid's own GPU
// work behind it: GPU buffers on such a stream are refused, naming the
// variable; host buffers, which need no GPU work, still run in order.
TEST_F(CudaStream, WithOneHardwareQueueGpuBuffersOnACudaStreamAreRefused) {
  ASSERT_EQ(setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 1), 0);
  braidComm_t comm = oneRank();
  ASSERT_NE(comm, nullptr) << braidGetLastError(nullptr);
  void* cudaStream = fake.makeStream();
  ASSERT_NE(cudaStream, nullptr);
  braidStream_t stream = nullptr;
  EXPECT_BRAID_OK(braidStreamCreateFromCuda(comm, cudaStream, &stream));
  ASSERT_EQ(unsetenv("CUDA_DEVICE_MAX_CONNECTIONS"), 0);
  static float gpu[8];
  fake.setDeviceRange(gpu, sizeof(gpu), 0, 0);
  EXPECT_BRAID_ERROR(braidAllReduce(gpu, gpu + 4, 4, braidFloat32, braidSum, comm, stream),
                     braidNotSupported, "CUDA_DEVICE_MAX_CONNECTIONS=1", "braidStreamCreate");
  fake.setDeviceRange(nullptr, 0, 0, 0);
  expectAnAllReduceInOrder(comm, stream, cudaStream);
  EXPECT_BRAID_OK(braidStreamDestroy(stream));
  EXPECT_BRAID_OK(braidCommDestroy(comm));
  EXPECT_EQ(fake.streamDestroy(cudaStream), 0);
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
