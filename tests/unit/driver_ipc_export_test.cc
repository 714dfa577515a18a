// DriverIpcDevice::exportRange against the stand-in CUDA driver: a buffer of
// the caller's, inside a cuMemAlloc allocation, exports as the handle of
// the whole allocation and its offset in it, and opens where a peer reads
// the bytes in place; memory the driver did not allocate so is refused.
#include <gtest/gtest.h>

#include <vector>

#include "driver_ipc_device_fixture.h"

namespace braid::transport::cuda_ipc::driver_ipc_test {
namespace {

TEST_F(DriverIpcDeviceTest, ABufferExportsAsItsAllocationsHandleAndItsOffset) {
  constexpr size_t kCount = 4096;
  auto device = makeDevice();
  ASSERT_TRUE(device);
  // The caller's cudaMalloc buffers, as the stand-in makes them.
  auto first = take(device->allocateUnshared(kCount * sizeof(float)));
  auto second = take(device->allocateUnshared(kCount * sizeof(float)));
  ASSERT_TRUE(first && second);
  const float* inside = floats(*first) + 256;
  auto range = take(device->exportRange(inside, 1024 * sizeof(float)));
  EXPECT_EQ(range.offset, 256 * sizeof(float));
  EXPECT_NE(range.allocationId, 0u);
  EXPECT_EQ(range.handle.scheme, IpcHandle::Scheme::kCudaIpc);
  // The same allocation, the same id; another allocation, another.
  EXPECT_EQ(take(device->exportRange(floats(*first), 4)).allocationId, range.allocationId);
  EXPECT_NE(take(device->exportRange(floats(*second), 4)).allocationId, range.allocationId);

  for (size_t i = 0; i < kCount; ++i) floats(*first)[i] = static_cast<float>(i);
  auto opened = take(device->openMemory(range.handle));
  ASSERT_TRUE(opened);
  // Its size as the driver says, against which a peer's offsets are checked.
  EXPECT_EQ(opened->bytes(), kCount * sizeof(float));
  ASSERT_OK(device->enqueueCopy(floats(*second),
                                static_cast<const uint8_t*>(opened->data()) + range.offset,
                                1024 * sizeof(float)));
  ASSERT_OK(device->synchronize());
  for (size_t i = 0; i < 1024; ++i) ASSERT_EQ(floats(*second)[i], static_cast<float>(256 + i));
}

TEST_F(DriverIpcDeviceTest, MemoryTheDriverDidNotAllocateIsNotExported) {
  auto device = makeDevice();
  ASSERT_TRUE(device);
  std::vector<float> host(1024);
  auto refused = device->exportRange(host.data(), host.size() * sizeof(float));
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("exporting a buffer"), std::string::npos)
      << refused.status().message();
  auto memory = take(device->allocateUnshared(4096));
  ASSERT_TRUE(memory);
  // Running past the end of its allocation.
  auto past = device->exportRange(static_cast<uint8_t*>(memory->data()) + 4000, 200);
  ASSERT_FALSE(past.isOk());
  EXPECT_NE(past.status().message().find("past the end"), std::string::npos)
      << past.status().message();
}

// The cache of exports answers only for bytes inside an exported
// allocation: a buffer past its end, in an allocation not exported yet, is
// not handed the first one's handle with an offset beyond it.
TEST_F(DriverIpcDeviceTest, TheCacheAnswersOnlyInsideAnExportedAllocation) {
  auto device = makeDevice();
  ASSERT_TRUE(device);
  auto first = take(device->allocateUnshared(4096));
  auto second = take(device->allocateUnshared(4096));
  auto third = take(device->allocateUnshared(4096));
  ASSERT_TRUE(first && second && third);
  ASSERT_GT(third->data(), second->data());
  ASSERT_GT(second->data(), first->data());
  take(device->exportRange(first->data(), 4096));
  EXPECT_TRUE(device->exportedRange(first->data(), 4096).isOk());
  EXPECT_FALSE(device->exportedRange(second->data(), 4).isOk());
  auto beyond = device->exportedRange(third->data(), 4);
  EXPECT_FALSE(beyond.isOk()) << "offset " << beyond->offset;
  auto straddling = device->exportedRange(static_cast<uint8_t*>(first->data()) + 4000, 200);
  EXPECT_FALSE(straddling.isOk());
}

}  // namespace
}  // namespace braid::transport::cuda_ipc::driver_ipc_test
