// Finding a CUDA driver the process loaded itself, and asking it what a
// pointer is. braid never loads the driver: loading it costs hundreds of
// milliseconds and memory in every CPU-only job, and a process whose buffers
// came from CUDA has loaded it already (the runtime opens libcuda.so.1 on
// first use). So the question "may this pointer be GPU memory?" is "is
// libcuda.so.1 loaded?", answered by dlopen with RTLD_NOLOAD, which only
// returns a handle to an object already there.
#include "src/memory_kind.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "src/common/strcat.h"
#include "src/device_staging.h"

namespace braid {
namespace {

// The few values of the driver API used here (cuda.h), declared rather than
// included so that every build can ask, with or without the CUDA headers.
using CuResult = int;                                 // CUresult
using CuDevicePtr = unsigned long long;               // CUdeviceptr (64-bit, CUdeviceptr_v2)
constexpr CuResult kCudaSuccess = 0;                  // CUDA_SUCCESS
constexpr CuResult kErrorInvalidValue = 1;            // CUDA_ERROR_INVALID_VALUE
constexpr CuResult kErrorNotInitialized = 3;          // CUDA_ERROR_NOT_INITIALIZED
constexpr CuResult kErrorDeinitialized = 4;           // CUDA_ERROR_DEINITIALIZED
constexpr CuResult kErrorStubLibrary = 34;            // CUDA_ERROR_STUB_LIBRARY
constexpr CuResult kErrorInsufficientDriver = 35;     // CUDA_ERROR_INSUFFICIENT_DRIVER
constexpr CuResult kErrorNoDevice = 100;              // CUDA_ERROR_NO_DEVICE
constexpr CuResult kErrorSystemNotReady = 802;        // CUDA_ERROR_SYSTEM_NOT_READY
constexpr CuResult kErrorSystemDriverMismatch = 803;  // CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
constexpr CuResult kErrorCompatNotSupported = 804;    // CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE
constexpr int kAttributeMemoryType = 2;               // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttributeIsManaged = 8;                // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr int kAttributeDeviceOrdinal = 9;            // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kAttributeLegacyIpcCapable = 10;        // ..._IS_LEGACY_CUDA_IPC_CAPABLE
constexpr int kAttributeRangeStart = 11;              // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr int kAttributeRangeSize = 12;               // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr unsigned int kMemoryTypeDevice = 2;         // CU_MEMORYTYPE_DEVICE
constexpr unsigned int kMemoryTypeUnified = 4;        // CU_MEMORYTYPE_UNIFIED
// CU_MEMORYTYPE_HOST (1) is pinned or registered host memory: host for braid.
// cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute* attributes,
//                        void** data, CUdeviceptr ptr): unlike cuPointerGetAttribute, it
// answers host memory the driver never saw with success and memory type 0,
// not with an error that tools such as compute-sanitizer report.
using PointerGetAttribute = CuResult (*)(unsigned int, int*, void**, CuDevicePtr);

constexpr const char* kDriverSoname = "libcuda.so.1";

// The loaded driver's cuPointerGetAttributes; null until one is found. Once
// found it stays: the handle that found it is never closed, so the driver
// cannot be unloaded under it.
std::atomic<PointerGetAttribute> driverPointerGetAttribute{nullptr};
// One thread looks at a time; the others wait for its answer rather than
// answer "no driver" while it looks, which could be wrong.
std::mutex lookMutex;
// The loader's count of objects ever loaded when the last look found no
// driver; 0 before the first.
std::atomic<unsigned long long> objectsLoadedAtLastLook{0};

// The number of objects the dynamic loader has ever loaded (dlpi_adds, the
// same in every entry, so the first is enough), or 0 where the loader does not
// count. It grows with every dlopen of something new and never shrinks, so an
// unchanged count means the driver cannot have appeared since the last look.
// The loader counts under the lock dl_iterate_phdr takes, so a dlopen that
// returned before this call is in the count: a driver loaded just before a
// question is seen by it. A time-based limit on looks was not: it answered
// "no driver" for a while after a look, and GPU memory allocated in that
// while was taken for host memory.
unsigned long long objectsEverLoaded() {
  unsigned long long adds = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* out) -> int {
        if (size >= offsetof(dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
          *static_cast<unsigned long long*>(out) = info->dlpi_adds;
        return 1;  // stop after the first object
      },
      &adds);
  return adds;
}

// Looks for a loaded driver where a library was loaded since the last look;
// true if one is (now) known.
bool lookForDriver() {
  const unsigned long long loaded = objectsEverLoaded();
  if (loaded != 0 && loaded == objectsLoadedAtLastLook.load(std::memory_order_acquire))
    return false;
  std::lock_guard<std::mutex> lock(lookMutex);
  if (driverPointerGetAttribute.load(std::memory_order_acquire)) return true;
  void* driver = dlopen(kDriverSoname, RTLD_NOW | RTLD_NOLOAD);
  if (driver != nullptr) {
    auto query = reinterpret_cast<PointerGetAttribute>(dlsym(driver, "cuPointerGetAttributes"));
    if (query != nullptr) {
      driverPointerGetAttribute.store(query, std::memory_order_release);
      return true;
    }
    dlclose(driver);  // not a CUDA driver after all: nothing to ask
  }
  // Only once this look has ended may another thread with the same count
  // skip its own.
  objectsLoadedAtLastLook.store(loaded, std::memory_order_release);
  return false;
}

// Whether the driver's answer `r` to a question about an address means host
// memory: an address it does not know (plain host memory), or a process in
// which no GPU memory can exist.
bool answersHost(CuResult r) {
  switch (r) {
    case kErrorInvalidValue:        // an address the driver does not know
    case kErrorNotInitialized:      // before cuInit: no GPU memory yet
    case kErrorDeinitialized:       // the driver shut down and freed all GPU memory
    case kErrorStubLibrary:         // a stub driver, which has no GPU
    case kErrorInsufficientDriver:  // a driver too old for any GPU it has
    case kErrorNoDevice:            // no GPU at all
    // cuInit's failures where the system cannot run CUDA (a driver and
    // kernel module that differ, in a container say): no GPU memory either.
    case kErrorSystemNotReady:
    case kErrorSystemDriverMismatch:
    case kErrorCompatNotSupported:
      return true;
    default:
      return false;
  }
}

}  // namespace

bool gpuMemoryPossible() {
  // Acquire costs what relaxed does on x86 and orders the use of the
  // function pointer after its store elsewhere.
  if (driverPointerGetAttribute.load(std::memory_order_acquire)) return true;
  return lookForDriver();
}

Result<BufferMemory> memoryKindOf(const void* p) {
  if (!gpuMemoryPossible()) return BufferMemory{};
  const PointerGetAttribute query = driverPointerGetAttribute.load(std::memory_order_acquire);
  const auto address = static_cast<CuDevicePtr>(reinterpret_cast<uintptr_t>(p));
  // One question for all three answers. The managed flag is a boolean that
  // the driver may write as one byte or as an int: zeroed first, either
  // reads right.
  unsigned int memoryType = 0;
  unsigned int isManaged = 0;
  int device = -1;
  int attributes[] = {kAttributeMemoryType, kAttributeIsManaged, kAttributeDeviceOrdinal};
  void* answers[] = {&memoryType, &isManaged, &device};
  if (const CuResult r = query(3, attributes, answers, address); r != kCudaSuccess) {
    if (answersHost(r)) return BufferMemory{};
    // A driver that cannot answer all three may still answer the type
    // alone; the flag and the ordinal then stay unknown, as they may.
    memoryType = isManaged = 0;
    device = -1;
    if (const CuResult type = query(1, attributes, answers, address); type != kCudaSuccess) {
      if (answersHost(type)) return BufferMemory{};
      return cudaDriverError(type, "asking the CUDA driver what memory it is");
    }
    if (query(1, &attributes[1], &answers[1], address) != kCudaSuccess) isManaged = 0;
    if (query(1, &attributes[2], &answers[2], address) != kCudaSuccess) device = -1;
  }
  const bool managed = isManaged != 0;
  MemoryKind kind;
  if (managed || memoryType == kMemoryTypeUnified)
    kind = MemoryKind::kManaged;  // the driver reports managed memory as device memory
  else if (memoryType == kMemoryTypeDevice)
    kind = MemoryKind::kDevice;
  else  // CU_MEMORYTYPE_HOST: pinned or registered host memory, which braid can move
    return BufferMemory{};
  // The ordinal only names the GPU: the kind is known, and a buffer of
  // unknown GPU is staged or refused by that kind all the same.
  return BufferMemory{kind, device};
}

Status checkInsideGpuAllocation(const void* p, size_t bytes) {
  const PointerGetAttribute query = driverPointerGetAttribute.load(std::memory_order_acquire);
  if (query == nullptr || bytes == 0) return Status::ok();
  const auto address = static_cast<CuDevicePtr>(reinterpret_cast<uintptr_t>(p));
  CuDevicePtr start = 0;
  size_t size = 0;
  int legacyIpc = 0;  // memory of cudaMalloc or cuMemAlloc, whose range is the allocation
  int attributes[] = {kAttributeRangeStart, kAttributeRangeSize, kAttributeLegacyIpcCapable};
  void* answers[] = {&start, &size, &legacyIpc};
  if (query(3, attributes, answers, address) != kCudaSuccess || size == 0 || legacyIpc == 0 ||
      address < start)
    return Status::ok();
  const size_t offset = address - start;
  if (offset <= size && bytes <= size - offset) return Status::ok();
  return invalidArgument(strCat(bytes, " bytes at offset ", offset, " of a GPU allocation of ",
                                size, " bytes run past the end of it (is the count too large?)"));
}

const char* memoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kDevice:
      return "GPU device";
    case MemoryKind::kManaged:
      return "GPU managed";
  }
  return "unknown";
}

}  // namespace braid
