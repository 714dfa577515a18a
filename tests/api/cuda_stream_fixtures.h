// The stand-in CUDA driver as the CUDA-stream tests drive it
// (cuda_stream_test.cc, cuda_stream_refusals_test.cc): its entry points, a
// one-rank communicator on a CUDA stream of it, and the "GPU work" they
// queue before and after a call.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "../unit/fake_gpu_work.h"
#include "../unit/fake_libcuda_loader.h"
#include "braid.h"
#include "expect_braid.h"

namespace braid::testing::cuda_stream {

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
  void (*failPointerQueries)(int);
  unsigned long (*copyCount)();
  unsigned long (*freedWhileWaited)();
  void (*setCapture)(void*, int);
  void (*setGlobalCapture)(int);
  void (*holdMemoryLock)(int);
  unsigned long (*memoryLockRefusals)();
  void (*stallCopies)(int);
  void (*setLegacyIpcCapable)(int);

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
           find(setDeviceRange, "fakeCudaSetDeviceRange") &&
           find(failPointerQueries, "fakeCudaFailPointerQueries") &&
           find(copyCount, "fakeCudaCopyCount") &&
           find(freedWhileWaited, "fakeCudaHostFreedWhileWaited") &&
           find(setCapture, "fakeCudaSetStreamCapture") &&
           find(setGlobalCapture, "fakeCudaSetGlobalCapture") &&
           find(holdMemoryLock, "fakeCudaHoldMemoryLockWhileStreamsWait") &&
           find(memoryLockRefusals, "fakeCudaMemoryLockRefusals") &&
           find(stallCopies, "fakeCudaStallCopies") &&
           find(setLegacyIpcCapable, "fakeCudaSetLegacyIpcCapable");
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

inline FakeDriver fake;

class CudaStream : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(fake.load()) << "FAKE_LIBCUDA is not set or not the stand-in (meson sets it)";
    // braid looks for a newly loaded driver at most once a millisecond.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
};

using braid::testing::HeldFill;
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

inline braidComm_t oneRank() {
  braidUniqueId id;
  braidComm_t comm = nullptr;
  if (braidGetUniqueId(&id) != braidSuccess || braidCommInitRank(&comm, 1, id, 0) != braidSuccess)
    return nullptr;
  return comm;
}

#ifdef BRAID_TEST_STAGING

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
inline void expectAnAllReduceInOrder(braidComm_t comm, braidStream_t stream, void* cudaStream) {
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

#endif

}  // namespace braid::testing::cuda_stream
