// GPU buffers given to the C ABI are refused with braidNotSupported and a
// message naming the argument and the device, not read as host memory. The
// process loads a stand-in CUDA driver (tests/unit/fake_libcuda.c, path in
// FAKE_LIBCUDA) that reports a range of ordinary host memory as GPU memory,
// so a call that did not refuse it would quietly succeed.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "braid.h"
#include "expect_braid.h"

namespace {

using SetDeviceRange = void (*)(void*, size_t, int, int);

// `call` returns braidNotSupported and its message names every one of `parts`.
#define EXPECT_REFUSED(call, ...) EXPECT_BRAID_ERROR(call, braidNotSupported, __VA_ARGS__)

class GpuBuffers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* path = std::getenv("FAKE_LIBCUDA");
    ASSERT_NE(path, nullptr) << "FAKE_LIBCUDA is not set (meson sets it)";
    // A first call before the driver appears, as in a job that initializes
    // CUDA after its communicator.
    braidUniqueId id;
    EXPECT_BRAID_OK(braidGetUniqueId(&id));
    EXPECT_BRAID_OK(braidCommInitRank(&comm_, 1, id, 0));
    ASSERT_NE(comm_, nullptr);
    float x = 1, y = 0;
    EXPECT_BRAID_OK(braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm_, nullptr));

    void* fake = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(fake, nullptr) << dlerror();
    setDeviceRange_ = reinterpret_cast<SetDeviceRange>(dlsym(fake, "fakeCudaSetDeviceRange"));
    ASSERT_NE(setDeviceRange_, nullptr) << dlerror();
    // braid looks for a newly loaded driver at most once a millisecond.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  static void TearDownTestSuite() {
    if (setDeviceRange_) setDeviceRange_(nullptr, 0, 0, 0);
    EXPECT_BRAID_OK(braidCommDestroy(comm_));
    comm_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(comm_, nullptr);
    ASSERT_NE(setDeviceRange_, nullptr);
    setDeviceRange_(gpu_, sizeof(gpu_), 3, 0);
  }
  void TearDown() override { setDeviceRange_(nullptr, 0, 0, 0); }

  static braidComm_t comm_;
  static SetDeviceRange setDeviceRange_;
  float gpu_[64] = {};  // "device memory of GPU 3" for the driver
  float host_[64] = {};
};
braidComm_t GpuBuffers::comm_ = nullptr;
SetDeviceRange GpuBuffers::setDeviceRange_ = nullptr;

TEST_F(GpuBuffers, AllReduceRefusesEitherBuffer) {
  EXPECT_REFUSED(braidAllReduce(gpu_, host_, 64, braidFloat32, braidSum, comm_, nullptr),
                 "braidAllReduce", "sendbuff is GPU device memory (device 3)", "host memory only");
  EXPECT_REFUSED(braidAllReduce(host_, gpu_, 64, braidFloat32, braidSum, comm_, nullptr),
                 "braidAllReduce", "recvbuff is GPU device memory (device 3)");
  EXPECT_REFUSED(braidAllReduce(gpu_, gpu_, 64, braidFloat32, braidSum, comm_, nullptr),
                 "braidAllReduce", "device 3");
  // A pointer into the middle of the allocation is GPU memory too.
  EXPECT_REFUSED(braidAllReduce(host_, gpu_ + 32, 32, braidFloat32, braidSum, comm_, nullptr),
                 "recvbuff", "device 3");
}

TEST_F(GpuBuffers, ManagedMemoryIsRefused) {
  setDeviceRange_(gpu_, sizeof(gpu_), 1, 1);
  EXPECT_REFUSED(braidAllReduce(gpu_, host_, 64, braidFloat32, braidSum, comm_, nullptr),
                 "sendbuff is GPU managed memory (device 1)");
}

TEST_F(GpuBuffers, OtherCollectivesRefuseTheBuffersTheyUse) {
  EXPECT_REFUSED(braidBroadcast(gpu_, host_, 64, braidFloat32, 0, comm_, nullptr), "braidBroadcast",
                 "sendbuff");
  EXPECT_REFUSED(braidReduce(host_, gpu_, 64, braidFloat32, braidSum, 0, comm_, nullptr),
                 "braidReduce", "recvbuff");
  EXPECT_REFUSED(braidAllGather(gpu_, host_, 64, braidFloat32, comm_, nullptr), "braidAllGather",
                 "sendbuff");
  EXPECT_REFUSED(braidReduceScatter(host_, gpu_, 64, braidFloat32, braidSum, comm_, nullptr),
                 "braidReduceScatter", "recvbuff");
  EXPECT_REFUSED(braidAllToAll(host_, gpu_, 64, braidFloat32, comm_, nullptr), "braidAllToAll",
                 "recvbuff");
  EXPECT_REFUSED(braidGather(gpu_, host_, 64, braidFloat32, 0, comm_, nullptr), "braidGather",
                 "sendbuff");
  EXPECT_REFUSED(braidScatter(gpu_, host_, 64, braidFloat32, 0, comm_, nullptr), "braidScatter",
                 "sendbuff");
}

TEST_F(GpuBuffers, SendAndRecvRefuseInsideAGroup) {
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_REFUSED(braidSend(gpu_, 64, braidFloat32, 0, comm_, nullptr), "braidSend",
                 "sendbuff is GPU device memory (device 3)");
  EXPECT_REFUSED(braidRecv(gpu_, 64, braidFloat32, 0, comm_, nullptr), "braidRecv",
                 "recvbuff is GPU device memory (device 3)");
  // Nothing was queued: the group ends with nothing to run.
  EXPECT_BRAID_OK(braidGroupEnd());
  // A self send and receive of host memory still pair up.
  float in[4] = {1, 2, 3, 4}, out[4] = {};
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(braidSend(in, 4, braidFloat32, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidRecv(out, 4, braidFloat32, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidGroupEnd());
  EXPECT_EQ(out[3], 4.0f);
}

TEST_F(GpuBuffers, HostBuffersStillWork) {
  for (int i = 0; i < 64; ++i) host_[i] = static_cast<float>(i);
  float result[64] = {};
  EXPECT_BRAID_OK(braidAllReduce(host_, result, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(result[63], 63.0f);
  EXPECT_BRAID_OK(braidAllReduce(result, result, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_BRAID_OK(braidBroadcast(host_, result, 64, braidFloat32, 0, comm_, nullptr));
  // count = 0 touches no buffer, so it is not refused.
  EXPECT_BRAID_OK(braidAllReduce(gpu_, gpu_, 0, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_BRAID_OK(braidBarrier(comm_, nullptr));
}

}  // namespace
