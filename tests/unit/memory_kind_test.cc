// How braid tells host from GPU memory: only through a CUDA driver the
// process loaded itself, here a stand-in (fake_libcuda.c) whose path comes in
// FAKE_LIBCUDA. Everything happens in one test, in order, since loading a
// library cannot be undone for the rest of the process.
#include "src/memory_kind.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

namespace braid {
namespace {

using SetDeviceRange = void (*)(void*, size_t, int, int);
using FailPointerQueries = void (*)(int);

// The kind, for a query the driver answered.
MemoryKind kindOf(const void* p) {
  Result<BufferMemory> memory = memoryKindOf(p);
  EXPECT_TRUE(memory.isOk()) << memory.status().message();
  return memory.isOk() ? memory.value().kind : MemoryKind::kHost;
}

bool driverLoaded() {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);
  return handle != nullptr;
}

TEST(MemoryKind, FoundOnlyOnceTheProcessLoadsTheDriver) {
  const char* fakePath = std::getenv("FAKE_LIBCUDA");
  ASSERT_NE(fakePath, nullptr) << "FAKE_LIBCUDA is not set (meson sets it)";
  ASSERT_FALSE(driverLoaded()) << "the test process loaded a CUDA driver before the test";

  std::vector<float> buffer(1024);
  int onStack = 0;
  EXPECT_FALSE(gpuMemoryPossible());
  EXPECT_EQ(kindOf(buffer.data()), MemoryKind::kHost);
  EXPECT_EQ(kindOf(&onStack), MemoryKind::kHost);
  EXPECT_EQ(kindOf(nullptr), MemoryKind::kHost);
  EXPECT_FALSE(driverLoaded()) << "asking for memory kinds loaded the driver";

  // Threads that ask while the driver appears: each must see it.
  std::atomic<int> sawDriver{0};
  std::vector<std::thread> askers;
  for (int i = 0; i < 4; ++i)
    askers.emplace_back([&] {
      auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (std::chrono::steady_clock::now() < giveUp)
        if (gpuMemoryPossible()) {
          ++sawDriver;
          return;
        }
    });

  void* fake = dlopen(fakePath, RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(fake, nullptr) << dlerror();
  for (auto& t : askers) t.join();
  EXPECT_EQ(sawDriver.load(), 4);
  auto setDeviceRange = reinterpret_cast<SetDeviceRange>(dlsym(fake, "fakeCudaSetDeviceRange"));
  ASSERT_NE(setDeviceRange, nullptr) << dlerror();

  EXPECT_TRUE(gpuMemoryPossible());

  // Host memory is asked about in a way the driver answers without an
  // error (cuPointerGetAttributes), which tools such as compute-sanitizer
  // would otherwise report at every call.
  using Count = unsigned long (*)();
  auto failedQueries = reinterpret_cast<Count>(dlsym(fake, "fakeCudaFailedPointerQueries"));
  ASSERT_NE(failedQueries, nullptr) << dlerror();
  EXPECT_EQ(kindOf(buffer.data()), MemoryKind::kHost);
  EXPECT_EQ(kindOf(&onStack), MemoryKind::kHost);
  EXPECT_EQ(failedQueries(), 0u);

  setDeviceRange(buffer.data(), 512 * sizeof(float), 3, 0);
  BufferMemory m = memoryKindOf(buffer.data() + 10).value();
  EXPECT_EQ(m.kind, MemoryKind::kDevice);
  EXPECT_EQ(m.device, 3);
  EXPECT_EQ(kindOf(buffer.data()), MemoryKind::kDevice);
  EXPECT_EQ(kindOf(buffer.data() + 512), MemoryKind::kHost);
  EXPECT_EQ(kindOf(&onStack), MemoryKind::kHost);
  EXPECT_EQ(kindOf(nullptr), MemoryKind::kHost);

  // A driver that cannot answer the three questions at once is asked one
  // at a time.
  auto failBatched =
      reinterpret_cast<FailPointerQueries>(dlsym(fake, "fakeCudaFailBatchedPointerQueries"));
  ASSERT_NE(failBatched, nullptr) << dlerror();
  failBatched(201);  // CUDA_ERROR_INVALID_CONTEXT
  m = memoryKindOf(buffer.data() + 10).value();
  EXPECT_EQ(m.kind, MemoryKind::kDevice);
  EXPECT_EQ(m.device, 3);
  failBatched(0);

  setDeviceRange(buffer.data(), 512 * sizeof(float), 1, 1);
  m = memoryKindOf(buffer.data() + 511).value();
  EXPECT_EQ(m.kind, MemoryKind::kManaged);
  EXPECT_EQ(m.device, 1);

  // A driver that holds no GPU memory at all answers host; any other error
  // leaves the kind unknown, which is an error, never host.
  auto failPointerQueries =
      reinterpret_cast<FailPointerQueries>(dlsym(fake, "fakeCudaFailPointerQueries"));
  ASSERT_NE(failPointerQueries, nullptr) << dlerror();
  for (int noGpuMemory :
       {3 /* NOT_INITIALIZED */, 4 /* DEINITIALIZED */, 34 /* STUB_LIBRARY */,
        35 /* INSUFFICIENT_DRIVER */, 100 /* NO_DEVICE */, 802 /* SYSTEM_NOT_READY */,
        803 /* SYSTEM_DRIVER_MISMATCH */, 804 /* COMPAT_NOT_SUPPORTED_ON_DEVICE */}) {
    failPointerQueries(noGpuMemory);
    EXPECT_EQ(kindOf(buffer.data()), MemoryKind::kHost) << "CUDA error " << noGpuMemory;
  }
  failPointerQueries(700);  // CUDA_ERROR_ILLEGAL_ADDRESS, sticky after a faulting kernel
  Result<BufferMemory> unknown = memoryKindOf(buffer.data());
  ASSERT_FALSE(unknown.isOk());
  EXPECT_EQ(unknown.status().code(), ErrorCode::kUnhandledCudaError);
  EXPECT_EQ(unknown.status().message(),
            "asking the CUDA driver what memory it is: an illegal memory access was encountered "
            "(CUDA error 700)");
  failPointerQueries(0);

  setDeviceRange(nullptr, 0, 0, 0);
  EXPECT_EQ(kindOf(buffer.data()), MemoryKind::kHost);
  EXPECT_STREQ(memoryKindName(MemoryKind::kDevice), "GPU device");
}

// A driver loaded right after a look at the loader is seen at the very next
// question: a program that allocates GPU memory at once after a host call
// must never have that memory taken for host memory, which braid would then
// read with the CPU. Run in a process of its own (meson's
// unit_memory_kind_at_once), since loading cannot be undone.
TEST(MemoryKind, SeenAtTheFirstQuestionAfterTheDriverLoads) {
  const char* fakePath = std::getenv("FAKE_LIBCUDA");
  ASSERT_NE(fakePath, nullptr) << "FAKE_LIBCUDA is not set (meson sets it)";
  ASSERT_FALSE(driverLoaded()) << "the test process loaded a CUDA driver before the test";
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(gpuMemoryPossible());

  void* fake = dlopen(fakePath, RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(fake, nullptr) << dlerror();
  EXPECT_TRUE(gpuMemoryPossible());
  auto setDeviceRange = reinterpret_cast<SetDeviceRange>(dlsym(fake, "fakeCudaSetDeviceRange"));
  ASSERT_NE(setDeviceRange, nullptr) << dlerror();
  std::vector<float> buffer(64);
  setDeviceRange(buffer.data(), buffer.size() * sizeof(float), 0, 0);
  EXPECT_EQ(kindOf(buffer.data()), MemoryKind::kDevice);
  setDeviceRange(nullptr, 0, 0, 0);
}

}  // namespace
}  // namespace braid
