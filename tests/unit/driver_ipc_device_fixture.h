// The fixture of the tests of DriverIpcDevice against the stand-in CUDA
// driver (driver_ipc_device_test.cc, driver_ipc_fd_handles_test.cc): its
// test hooks, and a check after each test that every call restored the
// caller's context and every test released what it made.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <utility>

#include "fake_gpu_work.h"
#include "fake_libcuda_loader.h"
#include "transports/cuda_ipc/driver_ipc_device.h"

namespace braid::transport::cuda_ipc::driver_ipc_test {

// The stand-in's test hooks.
struct FakeDriver {
  int (*launchKernel)(void*, void (*)(void*), void*);
  void (*failCopies)(int);
  void (*failStream)(void*);
  int (*contextDepth)();
  unsigned long (*ipcOpenCount)();
  unsigned long (*liveIpcMappings)();
  unsigned long (*liveEvents)();
  unsigned long (*liveVmmAllocations)();
  unsigned long (*liveVmmMaps)();

  bool load() {
    void* fake = braid::testing::openFakeLibcuda();
    if (fake == nullptr) return false;
    auto find = [&](auto& entry, const char* name) {
      return braid::testing::findEntry(fake, entry, name);
    };
    return find(launchKernel, "fakeCudaLaunchKernel") && find(failCopies, "fakeCudaFailCopies") &&
           find(failStream, "fakeCudaFailStream") && find(contextDepth, "fakeCudaContextDepth") &&
           find(ipcOpenCount, "fakeCudaIpcOpenCount") &&
           find(liveIpcMappings, "fakeCudaLiveIpcMappings") &&
           find(liveEvents, "fakeCudaLiveEvents") &&
           find(liveVmmAllocations, "fakeCudaLiveVmmAllocations") &&
           find(liveVmmMaps, "fakeCudaLiveVmmMaps");
  }
};

inline FakeDriver fake;

#define ASSERT_OK(expr)                               \
  do {                                                \
    const ::braid::Status status_ = (expr);           \
    ASSERT_TRUE(status_.isOk()) << status_.message(); \
  } while (0)

template <typename T>
T take(Result<T> result) {
  EXPECT_TRUE(result.isOk()) << result.status().message();
  return result.isOk() ? std::move(result).value() : T{};
}

inline float* floats(DeviceMemory& memory) {
  return static_cast<float*>(memory.data());
}

using braid::testing::SlowFill;

// A device whose wait once ran out looks once per synchronize(): this
// waits, up to `seconds`, for its work to finish after all.
inline Status finishedWithin(DriverIpcDevice& device, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  Status status = device.synchronize();
  while (!status.isOk() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    status = device.synchronize();
  }
  return status;
}

using braid::testing::Gate;

class DriverIpcDeviceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(fake.load()) << "FAKE_LIBCUDA is not set or not the stand-in (meson sets it)";
  }

  void SetUp() override {
    ASSERT_NE(fake.liveEvents, nullptr);
    eventsBefore_ = fake.liveEvents();
    mappingsBefore_ = fake.liveIpcMappings();
    vmmMapsBefore_ = fake.liveVmmMaps();
    vmmAllocationsBefore_ = fake.liveVmmAllocations();
  }

  // Every call restores the caller's context, and every test releases
  // what it made.
  void TearDown() override {
    if (fake.contextDepth == nullptr) return;
    EXPECT_EQ(fake.contextDepth(), 0);
    EXPECT_EQ(fake.liveEvents(), eventsBefore_ + eventsLeftOnPurpose_) << "events left";
    EXPECT_EQ(fake.liveIpcMappings(), mappingsBefore_) << "mappings left";
    EXPECT_EQ(fake.liveVmmMaps(), vmmMapsBefore_ + vmmMapsLeftOnPurpose_) << "cuMem mappings left";
    EXPECT_EQ(fake.liveVmmAllocations(), vmmAllocationsBefore_) << "cuMem allocations not released";
  }

  static std::unique_ptr<DriverIpcDevice> makeDevice() { return take(DriverIpcDevice::create(0)); }

 protected:
  unsigned long eventsLeftOnPurpose_ = 0;
  // cuMem memory of a GPU whose work never finished: mapped for the rest of
  // the process (its allocation handle is released once mapped).
  unsigned long vmmMapsLeftOnPurpose_ = 0;

 private:
  unsigned long eventsBefore_ = 0;
  unsigned long mappingsBefore_ = 0;
  unsigned long vmmMapsBefore_ = 0;
  unsigned long vmmAllocationsBefore_ = 0;
};

}  // namespace braid::transport::cuda_ipc::driver_ipc_test
