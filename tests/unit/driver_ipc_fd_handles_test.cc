// DriverIpcDevice on a GPU that exports cuMem memory as POSIX file
// descriptors (the stand-in's FAKE_CUDA_VMM=1), against the stand-in CUDA
// driver (driver_ipc_device_test.cc says how it plays a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "driver_ipc_device_fixture.h"
#include "transports/cuda_ipc/shared_gpu_memory.h"

namespace braid::transport::cuda_ipc {
namespace {

using namespace driver_ipc_test;

// A GPU that exports cuMem memory as POSIX file descriptors (the
// stand-in's FAKE_CUDA_VMM=1): allocate() exports one, handed over by the
// device's descriptor server, and openMemory maps the same memory again.
class FdHandles : public DriverIpcDeviceTest {
 protected:
  void SetUp() override {
    setenv("FAKE_CUDA_VMM", "1", 1);
    DriverIpcDeviceTest::SetUp();
  }
  void TearDown() override {
    unsetenv("FAKE_CUDA_VMM");
    DriverIpcDeviceTest::TearDown();
  }
};

TEST_F(FdHandles, MemoryIsExportedAsADescriptorAndOpensAsTheSameMemory) {
  constexpr int kCount = 1000;  // not a multiple of the granularity
  auto device = makeDevice();
  ASSERT_TRUE(device);
  EXPECT_TRUE(device->exportsFds());
  auto exported = take(device->allocate(kCount * sizeof(float)));
  auto source = take(device->allocate(kCount * sizeof(float)));
  ASSERT_TRUE(exported && source);
  EXPECT_EQ(exported->handle().scheme, IpcHandle::Scheme::kPosixFd);
  EXPECT_NE(exported->handle().bytes, source->handle().bytes);
  EXPECT_EQ(fake.liveVmmMaps(), 2u);

  const unsigned long legacyOpens = fake.ipcOpenCount();
  auto opened = take(device->openMemory(exported->handle()));
  ASSERT_TRUE(opened);
  EXPECT_EQ(fake.ipcOpenCount(), legacyOpens);  // no legacy handle was opened
  EXPECT_EQ(fake.liveVmmMaps(), 3u);
  // A mapping of its own at another address, of the same memory.
  EXPECT_NE(opened->data(), exported->data());
  for (int i = 0; i < kCount; ++i) {
    floats(*source)[i] = 0.25f * static_cast<float>(i);
    floats(*exported)[i] = -1.0f;
  }
  ASSERT_OK(device->enqueueCopy(opened->data(), source->data(), kCount * sizeof(float)));
  ASSERT_OK(device->synchronize());
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(floats(*exported)[i], 0.25f * static_cast<float>(i));

  opened.reset();
  EXPECT_EQ(fake.liveVmmMaps(), 2u);
  // Once the memory is gone, its handle opens no more.
  const IpcHandle stale = exported->handle();
  exported.reset();
  auto late = device->openMemory(stale);
  ASSERT_FALSE(late.isOk());
  EXPECT_EQ(late.status().code(), ErrorCode::kRemoteError);
  EXPECT_NE(late.status().message().find("refused"), std::string::npos) << late.status().message();
}

// Memory and events that no peer opens (spill blocks, scratch, the events
// of staged copies) are made without a handle: no cuMem mapping and no
// descriptor where memory is exported as descriptors, no interprocess
// event. They work as the others do.
TEST_F(FdHandles, UnsharedMemoryAndEventsExportNothing) {
  constexpr int kCount = 1000;
  auto device = makeDevice();
  ASSERT_TRUE(device);
  auto unshared = take(device->allocateUnshared(kCount * sizeof(float)));
  auto source = take(device->allocate(kCount * sizeof(float)));
  auto event = take(device->createUnsharedEvent());
  ASSERT_TRUE(unshared && source && event);
  EXPECT_EQ(fake.liveVmmMaps(), 1u);  // the exported source's alone
  EXPECT_EQ(unshared->handle().bytes, IpcHandle{}.bytes);
  EXPECT_EQ(event->handle().bytes, IpcHandle{}.bytes);
  for (int i = 0; i < kCount; ++i) floats(*source)[i] = 0.75f * static_cast<float>(i);
  ASSERT_OK(device->enqueueCopy(unshared->data(), source->data(), kCount * sizeof(float)));
  ASSERT_OK(device->enqueueRecord(*event));
  ASSERT_OK(device->synchronize());
  EXPECT_TRUE(take(device->hasRun(*event)));
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(floats(*unshared)[i], 0.75f * static_cast<float>(i));
  const auto none = device->allocateUnshared(0);
  ASSERT_FALSE(none.isOk());
  EXPECT_EQ(none.status().code(), ErrorCode::kInvalidArgument);
}

TEST_F(FdHandles, LegacyHandlesWhenAskedAndEitherKindOpens) {
  auto fds = makeDevice();
  auto legacy = take(DriverIpcDevice::create(0, DriverIpcDevice::Handles::kLegacy));
  ASSERT_TRUE(fds && legacy);
  EXPECT_FALSE(legacy->exportsFds());
  auto a = take(legacy->allocate(4096));
  auto b = take(fds->allocate(4096));
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->handle().scheme, IpcHandle::Scheme::kCudaIpc);
  EXPECT_EQ(b->handle().scheme, IpcHandle::Scheme::kPosixFd);
  auto bOnLegacy = take(legacy->openMemory(b->handle()));
  auto aOnFds = take(fds->openMemory(a->handle()));
  ASSERT_TRUE(bOnLegacy && aOnFds);
  std::memset(b->data(), 7, 4096);
  EXPECT_EQ(static_cast<const uint8_t*>(bOnLegacy->data())[4095], 7);
}

// braidMemAlloc's memory (shared_gpu_memory.h) is exported as it is made:
// a device finds its export with no driver call, marked as memory a peer's
// mapping keeps alive, and so it does: the owner frees it, and the peer's
// mapping still holds its bytes.
TEST_F(FdHandles, SharedMemoryIsExportedAsMadeAndOutlivesItsOwnersFree) {
  constexpr size_t kBytes = 3000;
  auto device = makeDevice();
  ASSERT_TRUE(device);
  auto* data = static_cast<uint8_t*>(take(allocateSharedGpuMemory(kBytes)));
  ASSERT_NE(data, nullptr);
  auto range = take(device->exportedRange(data + 100, 200));
  EXPECT_TRUE(range.peerHoldsMemory);
  EXPECT_EQ(range.offset, 100u);
  EXPECT_EQ(range.handle.scheme, IpcHandle::Scheme::kPosixFd);
  EXPECT_NE(range.allocationId & (uint64_t{1} << 63), 0u);  // apart from the driver's ids
  EXPECT_FALSE(sharedGpuRange(data, size_t{1} << 30));      // past its end
  EXPECT_FALSE(sharedGpuRange(data - 4096, 4));             // before it

  auto opened = take(device->openMemory(range.handle));
  ASSERT_TRUE(opened);
  for (size_t i = 0; i < kBytes; ++i) data[i] = static_cast<uint8_t>(i * 7);
  std::vector<uint64_t> freed;
  const uint64_t seen = device->heldFreedSince(0, {}, freed);
  ASSERT_OK(freeSharedGpuMemory(data));
  // Its peers are told (IpcDevice::heldFreedSince), and one that had not
  // fetched its descriptor yet cannot now.
  EXPECT_EQ(device->heldFreedSince(seen, {range.allocationId}, freed), seen + 1);
  EXPECT_EQ(freed, std::vector<uint64_t>{range.allocationId});
  EXPECT_FALSE(device->openMemory(range.handle).isOk());
  EXPECT_FALSE(sharedGpuRange(data, 4));
  EXPECT_FALSE(device->exportedRange(data, 4).isOk());
  EXPECT_EQ(freeSharedGpuMemory(data).code(), ErrorCode::kInvalidArgument);  // freed already
  const auto* held = static_cast<const uint8_t*>(opened->data());
  for (size_t i = 0; i < kBytes; ++i) ASSERT_EQ(held[i], static_cast<uint8_t>(i * 7)) << i;
  opened.reset();  // the last mapping: now the memory goes (TearDown checks)
}

// However many others are freed before a connection next looks, one it
// named to its peer is reported freed.
TEST_F(FdHandles, AFreedAllocationIsReportedAfterThousandsOfOtherFrees) {
  auto device = makeDevice();
  ASSERT_TRUE(device);
  void* named = take(allocateSharedGpuMemory(4096));
  ASSERT_NE(named, nullptr);
  const uint64_t id = take(device->exportedRange(named, 4)).allocationId;
  std::vector<uint64_t> freed;
  const uint64_t seen = device->heldFreedSince(0, {}, freed);
  ASSERT_OK(freeSharedGpuMemory(named));
  for (int i = 0; i < 5000; ++i) {
    void* other = take(allocateSharedGpuMemory(4096));
    ASSERT_NE(other, nullptr);
    ASSERT_OK(freeSharedGpuMemory(other));
  }
  void* kept = take(allocateSharedGpuMemory(4096));
  ASSERT_NE(kept, nullptr);
  const uint64_t keptId = take(device->exportedRange(kept, 4)).allocationId;
  device->heldFreedSince(seen, {id, keptId}, freed);
  EXPECT_EQ(freed, std::vector<uint64_t>{id});  // and not the one still allocated
  ASSERT_OK(freeSharedGpuMemory(kept));
}

// Once the GPU's work did not finish in time (a peer's process may have
// ended before its GPU ran what this GPU waits for), the GPU may still read
// or write braidMemAlloc memory: its free forgets it but leaves it mapped.
TEST_F(FdHandles, SharedMemoryOfAGpuWhoseWorkNeverFinishedIsLeftMappedAtItsFree) {
  auto device = makeDevice();
  ASSERT_TRUE(device);
  device->setSynchronizeLimit(0.2);
  void* kept = take(allocateSharedGpuMemory(4096));
  void* freedBefore = take(allocateSharedGpuMemory(4096));
  ASSERT_TRUE(kept && freedBefore);
  ASSERT_OK(freeSharedGpuMemory(freedBefore));  // unmapped: its GPU is well
  const unsigned long maps = fake.liveVmmMaps();
  Gate gate;  // the GPU, stopped
  ASSERT_EQ(fake.launchKernel(device->stream(), Gate::run, &gate), 0);
  EXPECT_EQ(device->synchronize().code(), ErrorCode::kTimeout);
  ASSERT_OK(freeSharedGpuMemory(kept));
  EXPECT_EQ(fake.liveVmmMaps(), maps);  // still mapped
  EXPECT_FALSE(sharedGpuRange(kept, 4));
  EXPECT_EQ(freeSharedGpuMemory(kept).code(), ErrorCode::kInvalidArgument);  // forgotten
  gate.open.store(true);
  ASSERT_OK(finishedWithin(*device, 2.0));
  vmmMapsLeftOnPurpose_ = 1;
}

TEST_F(DriverIpcDeviceTest, WithoutDescriptorsSharedMemoryIsPlainMemoryNotReadInPlace) {
  auto device = makeDevice();
  ASSERT_TRUE(device);
  void* data = take(allocateSharedGpuMemory(4096));
  ASSERT_NE(data, nullptr);
  EXPECT_FALSE(sharedGpuRange(data, 4096));
  EXPECT_FALSE(device->exportedRange(data, 4096).isOk());
  // Nor with a legacy handle, even where every buffer may be read in place:
  // its owner may free it while a peer has it open.
  auto refused = device->exportRange(data, 4096);
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("braidMemAlloc"), std::string::npos);
  ASSERT_OK(freeSharedGpuMemory(data));
}

// BRAID_CUDA_IPC_HANDLES=legacy: peers fetch no descriptor, so braidMemAlloc's
// memory is not offered to them.
TEST_F(FdHandles, WithLegacyHandlesSharedMemoryIsNotOffered) {
  auto device = take(DriverIpcDevice::create(0, DriverIpcDevice::Handles::kLegacy));
  ASSERT_TRUE(device);
  void* data = take(allocateSharedGpuMemory(4096));
  ASSERT_NE(data, nullptr);
  EXPECT_TRUE(sharedGpuRange(data, 4096));
  EXPECT_FALSE(device->exportedRange(data, 4096).isOk());
  EXPECT_FALSE(device->exportRange(data, 4096).isOk());
  ASSERT_OK(freeSharedGpuMemory(data));
}

TEST_F(DriverIpcDeviceTest, WithoutDescriptorsAutoUsesLegacyHandlesAndPosixFdIsRefused) {
  auto device = makeDevice();
  ASSERT_TRUE(device);
  EXPECT_FALSE(device->exportsFds());
  auto memory = take(device->allocate(256));
  ASSERT_TRUE(memory);
  EXPECT_EQ(memory->handle().scheme, IpcHandle::Scheme::kCudaIpc);
  auto refused = DriverIpcDevice::create(0, DriverIpcDevice::Handles::kPosixFd);
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), ErrorCode::kNotSupported);
  EXPECT_NE(refused.status().message().find("BRAID_CUDA_IPC_HANDLES=legacy"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace braid::transport::cuda_ipc
