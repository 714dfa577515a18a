// The CUDA driver API as the CUDA-IPC transport's device uses it: its
// types and values (declared here rather than taken from cuda.h, so that
// braid builds without CUDA), the entry points looked up in the libcuda.so.1
// the process loaded (src/common/cuda_driver.h), and the GPU's primary
// context that every call runs in (driver_ipc_device.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "src/common/cuda_driver.h"
#include "src/common/status.h"
#include "src/common/strcat.h"
#include "transports/cuda_ipc/fd_handoff.h"
#include "transports/cuda_ipc/ipc_device.h"

namespace braid::transport::cuda_ipc::driver_ipc {

// The driver API's types and values (cuda.h), declared rather than included.
using CuResult = cudadriver::Result;
using cudadriver::DevicePtr;
using CuContext = cudadriver::Context;
using CuStream = cudadriver::Stream;
using CuDevice = int;   // CUdevice
using CuEvent = void*;  // CUevent
constexpr CuResult kSuccess = cudadriver::kSuccess;
constexpr unsigned kStreamNonBlocking = 0x1;           // CU_STREAM_NON_BLOCKING
constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
// Interprocess events must not time (CUDA refuses the handle otherwise).
constexpr unsigned kEventDisableTiming = 0x2;  // CU_EVENT_DISABLE_TIMING
constexpr unsigned kEventInterprocess = 0x4;   // CU_EVENT_INTERPROCESS
// Pinned for every context, and mapped into the device's address space, so
// that kernels may read it (a reduction of bytes a host connection brought).
constexpr unsigned kHostAllocPortableMapped = 0x1 | 0x2;  // CU_MEMHOSTALLOC_PORTABLE | _DEVICEMAP
constexpr CuResult kNotReady = 600;                       // CUDA_ERROR_NOT_READY
// A process-wide id of the allocation a pointer lies in, never reused.
constexpr int kPointerAttributeBufferId = 7;  // CU_POINTER_ATTRIBUTE_BUFFER_ID

// The virtual memory management API (cuMem*), for memory exported as a
// POSIX file descriptor.
using CuMemHandle = unsigned long long;  // CUmemGenericAllocationHandle
struct CuMemLocation {                   // CUmemLocation
  int type;
  int id;
};
struct CuMemAllocationProp {  // CUmemAllocationProp (v1)
  int type;
  int requestedHandleTypes;
  CuMemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
static_assert(sizeof(CuMemAllocationProp) == 32);
struct CuMemAccessDesc {  // CUmemAccessDesc
  CuMemLocation location;
  int flags;
};
constexpr int kHandleTypePosixFd = 0x1;        // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
constexpr int kAllocationPinned = 0x1;         // CU_MEM_ALLOCATION_TYPE_PINNED
constexpr int kLocationDevice = 0x1;           // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kAccessReadWrite = 0x3;          // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
constexpr int kGranularityMinimum = 0x0;       // CU_MEM_ALLOC_GRANULARITY_MINIMUM
constexpr int kAttributeVmm = 102;             // ..._VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
constexpr int kAttributePosixFdHandles = 103;  // ..._HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
// CU_DEVICE_ATTRIBUTE_MPS_ENABLED: contexts on the device are shared through
// MPS. Drivers older than CUDA 12.x answer CUDA_ERROR_INVALID_VALUE.
constexpr int kAttributeMpsEnabled = 133;

// What an IpcHandle of scheme kPosixFd holds.
struct FdMemoryHandle {
  FdTicket ticket;
  uint64_t bytes;  // mapped: a multiple of the allocation granularity
};
static_assert(sizeof(FdMemoryHandle) <= sizeof(IpcHandle::bytes));

// CUipcMemHandle and CUipcEventHandle: passed by value, as cuda.h declares
// them, so the calls' ABI is the driver's.
struct CuIpcMemHandle {
  char reserved[64];
};
struct CuIpcEventHandle {
  char reserved[64];
};
static_assert(sizeof(CuIpcMemHandle) == sizeof(IpcHandle::bytes));
static_assert(sizeof(CuIpcEventHandle) == sizeof(IpcHandle::bytes));

template <typename CudaHandle>
inline CudaHandle toCuda(const IpcHandle& handle) {
  CudaHandle h;
  std::memcpy(h.reserved, handle.bytes.data(), sizeof(h.reserved));
  return h;
}

template <typename CudaHandle>
inline IpcHandle fromCuda(const CudaHandle& h) {
  IpcHandle handle;
  std::memcpy(handle.bytes.data(), h.reserved, sizeof(h.reserved));
  return handle;
}

inline DevicePtr devicePointer(const void* p) {
  return static_cast<DevicePtr>(reinterpret_cast<uintptr_t>(p));
}

struct Driver {
  CuResult (*init)(unsigned) = nullptr;
  CuResult (*deviceGet)(CuDevice*, int) = nullptr;
  CuResult (*primaryCtxRetain)(CuContext*, CuDevice) = nullptr;
  CuResult (*primaryCtxRelease)(CuDevice) = nullptr;
  CuResult (*ctxPushCurrent)(CuContext) = nullptr;
  CuResult (*ctxPopCurrent)(CuContext*) = nullptr;
  CuResult (*streamCreate)(CuStream*, unsigned) = nullptr;
  CuResult (*streamDestroy)(CuStream) = nullptr;
  CuResult (*streamSynchronize)(CuStream) = nullptr;
  CuResult (*streamQuery)(CuStream) = nullptr;
  CuResult (*streamWaitEvent)(CuStream, CuEvent, unsigned) = nullptr;
  CuResult (*memAlloc)(DevicePtr*, size_t) = nullptr;
  CuResult (*memFree)(DevicePtr) = nullptr;
  CuResult (*memHostAlloc)(void**, size_t, unsigned) = nullptr;
  CuResult (*memFreeHost)(void*) = nullptr;
  // Unified addressing: device and pinned host memory alike.
  CuResult (*memcpyAsync)(DevicePtr, DevicePtr, size_t, CuStream) = nullptr;
  CuResult (*ipcGetMemHandle)(CuIpcMemHandle*, DevicePtr) = nullptr;
  CuResult (*ipcOpenMemHandle)(DevicePtr*, CuIpcMemHandle, unsigned) = nullptr;
  CuResult (*ipcCloseMemHandle)(DevicePtr) = nullptr;
  CuResult (*eventCreate)(CuEvent*, unsigned) = nullptr;
  CuResult (*eventDestroy)(CuEvent) = nullptr;
  CuResult (*eventRecord)(CuEvent, CuStream) = nullptr;
  CuResult (*eventQuery)(CuEvent) = nullptr;
  CuResult (*ipcGetEventHandle)(CuIpcEventHandle*, CuEvent) = nullptr;
  CuResult (*ipcOpenEventHandle)(CuEvent*, CuIpcEventHandle) = nullptr;
  CuResult (*getErrorString)(CuResult, const char**) = nullptr;
  // Optional (CUDA 10.1): null where the driver has no graph capture.
  cudadriver::ExchangeCaptureMode threadExchangeStreamCaptureMode = nullptr;
  // Optional: without them, no buffer of the caller is exported
  // (exportRange), and every message goes through the slots.
  CuResult (*memGetAddressRange)(DevicePtr*, size_t*, DevicePtr) = nullptr;
  CuResult (*pointerGetAttribute)(void*, int, DevicePtr) = nullptr;
  // Optional: the GPU of the thread's current context (braidMemAlloc).
  CuResult (*ctxGetDevice)(CuDevice*) = nullptr;
  // Optional: drivers before CUDA 10.2 lack them (vmm false then).
  bool vmm = false;
  CuResult (*deviceGetAttribute)(int*, int, CuDevice) = nullptr;
  CuResult (*memCreate)(CuMemHandle*, size_t, const CuMemAllocationProp*,
                        unsigned long long) = nullptr;
  CuResult (*memRelease)(CuMemHandle) = nullptr;
  CuResult (*memAddressReserve)(DevicePtr*, size_t, size_t, DevicePtr,
                                unsigned long long) = nullptr;
  CuResult (*memAddressFree)(DevicePtr, size_t) = nullptr;
  CuResult (*memMap)(DevicePtr, size_t, size_t, CuMemHandle, unsigned long long) = nullptr;
  CuResult (*memUnmap)(DevicePtr, size_t) = nullptr;
  CuResult (*memSetAccess)(DevicePtr, size_t, const CuMemAccessDesc*, size_t) = nullptr;
  CuResult (*memGetAllocationGranularity)(size_t*, const CuMemAllocationProp*, int) = nullptr;
  CuResult (*memExportToShareableHandle)(void*, CuMemHandle, int, unsigned long long) = nullptr;
  CuResult (*memImportFromShareableHandle)(CuMemHandle*, void*, int) = nullptr;

  // The driver's error `result` of `what`, with CUDA's message.
  Status error(CuResult result, std::string_view what) const {
    const char* text = nullptr;
    if (getErrorString(result, &text) != kSuccess || text == nullptr) text = "unknown CUDA error";
    return Status(ErrorCode::kUnhandledCudaError,
                  strCat(what, ": ", text, " (CUDA error ", result, ")"));
  }
};

// The driver's entry points, or null and why not.
const Driver* loadDriver(std::string& why);

// The GPU's primary context, retained while the device, or any memory or
// event it made, is alive: each of those frees into it when it goes.
class PrimaryContext {
 public:
  static Result<std::shared_ptr<const PrimaryContext>> retain(const Driver& d, int ordinal) {
    // Harmless where the application initialised CUDA already, as it has
    // when its buffers are on a GPU; needed where only braid uses it.
    if (CuResult r = d.init(0); r != kSuccess) return d.error(r, "cuda_ipc: initialising CUDA");
    CuDevice device = 0;
    if (CuResult r = d.deviceGet(&device, ordinal); r != kSuccess)
      return d.error(r, strCat("cuda_ipc: GPU ", ordinal));
    CuContext context = nullptr;
    if (CuResult r = d.primaryCtxRetain(&context, device); r != kSuccess)
      return d.error(r, strCat("cuda_ipc: the primary context of GPU ", ordinal));
    return std::shared_ptr<const PrimaryContext>(new PrimaryContext(d, device, context));
  }

  ~PrimaryContext() {
    if (!wedged()) (void)driver_.primaryCtxRelease(device_);
  }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  const Driver& driver() const { return driver_; }
  CuDevice device() const { return device_; }

  // Work queued in this context did not finish in time (a peer's process
  // may have ended before its GPU ran a record that this stream waits for):
  // what the GPU may still read or write is never freed, and the context is
  // never released, since either could wait for that work forever.
  void markWedged() const { wedged_.store(true, std::memory_order_relaxed); }
  bool wedged() const { return wedged_.load(std::memory_order_relaxed); }

  // Runs `work` (returning a Status) with the context current on this
  // thread, then restores the thread's own.
  // The thread's capture mode is relaxed meanwhile (cudadriver::RelaxedCapture).
  template <typename Work>
  Status run(std::string_view what, Work&& work) const {
    const cudadriver::RelaxedCapture relaxed(driver_.threadExchangeStreamCaptureMode);
    if (CuResult r = driver_.ctxPushCurrent(context_); r != kSuccess)
      return driver_.error(r, strCat(what, ": making the GPU's context current"));
    Status status = work();
    CuContext popped = nullptr;
    (void)driver_.ctxPopCurrent(&popped);
    return status;
  }

  // One driver call, `call` returning its CUresult, with the context current.
  template <typename Call>
  Status call(std::string_view what, Call&& driverCall) const {
    return run(what, [&] {
      const CuResult r = driverCall();
      return r == kSuccess ? Status::ok() : driver_.error(r, what);
    });
  }

 private:
  PrimaryContext(const Driver& d, CuDevice device, CuContext context)
      : driver_(d), device_(device), context_(context) {}

  const Driver& driver_;
  CuDevice device_;
  CuContext context_;
  mutable std::atomic<bool> wedged_{false};
};

}  // namespace braid::transport::cuda_ipc::driver_ipc
