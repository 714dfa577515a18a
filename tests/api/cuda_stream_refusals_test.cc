// What would hang a call on a CUDA stream, against the stand-in driver: a
// stream that captures a graph (refused, alone and in a group, leaving
// nothing on the stream), a graph captured on another thread (calls run),
// one hardware queue for every stream (GPU buffers refused), and an
// application thread that holds the driver's memory lock while it waits
// for the stream (staging takes no such lock); and a buffer the driver
// cannot place.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "braid.h"
#include "cuda_stream_fixtures.h"
#include "expect_braid.h"

namespace {

using namespace braid::testing::cuda_stream;

#ifdef BRAID_TEST_STAGING

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

// A buffer the driver cannot place (a sticky error after a kernel that
// faulted) is refused when the call is made, alone and in a group, with the
// driver's message, and nothing is left on the stream.
TEST_F(OneRankOnACudaStream, ABufferOfUnknownKindIsRefusedAtTheCall) {
  float x[4] = {1, 2, 3, 4}, y[4] = {};
  fake.failPointerQueries(700);  // CUDA_ERROR_ILLEGAL_ADDRESS
  EXPECT_BRAID_ERROR(braidAllReduce(x, y, 4, braidFloat32, braidSum, comm_, stream_),
                     braidUnhandledCudaError, "sendbuff", "what memory it is", "700");
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_ERROR(braidAllReduce(y, y, 4, braidFloat32, braidSum, comm_, stream_),
                     braidUnhandledCudaError, "sendbuff", "700");
  EXPECT_BRAID_ERROR(braidGroupEnd(), braidUnhandledCudaError, "none of them ran", "700");
  fake.failPointerQueries(0);
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

#endif

}  // namespace
