#include "transports/cuda_ipc/driver_ipc_device.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>

#include "src/common/cuda_driver.h"
#include "src/common/log.h"
#include "src/common/strcat.h"
#include "transports/cuda_ipc/fd_handoff.h"

namespace braid::transport::cuda_ipc {
namespace driver_ipc {
namespace {

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
CudaHandle toCuda(const IpcHandle& handle) {
  CudaHandle h;
  std::memcpy(h.reserved, handle.bytes.data(), sizeof(h.reserved));
  return h;
}

template <typename CudaHandle>
IpcHandle fromCuda(const CudaHandle& h) {
  IpcHandle handle;
  std::memcpy(handle.bytes.data(), h.reserved, sizeof(h.reserved));
  return handle;
}

DevicePtr devicePointer(const void* p) {
  return static_cast<DevicePtr>(reinterpret_cast<uintptr_t>(p));
}

}  // namespace

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

namespace {

// The driver's entry points, or null and why not. Only a complete lookup is
// kept: a process may load the driver after a first device was asked for
// (a framework that starts CUDA lazily), and must then get it.
const Driver* loadDriver(std::string& why) {
  static std::mutex mutex;
  static Driver loaded;
  static bool found = false;
  std::lock_guard lock(mutex);
  if (found) return &loaded;
  Driver d;
  cudadriver::EntryFinder finder;
  finder.find(d.init, "cuInit");
  finder.find(d.deviceGet, "cuDeviceGet");
  finder.find(d.primaryCtxRetain, "cuDevicePrimaryCtxRetain");
  finder.find(d.primaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  finder.find(d.ctxPushCurrent, "cuCtxPushCurrent_v2");
  finder.find(d.ctxPopCurrent, "cuCtxPopCurrent_v2");
  finder.find(d.streamCreate, "cuStreamCreate");
  finder.find(d.streamDestroy, "cuStreamDestroy_v2");
  finder.find(d.streamSynchronize, "cuStreamSynchronize");
  finder.find(d.streamWaitEvent, "cuStreamWaitEvent");
  finder.find(d.memAlloc, "cuMemAlloc_v2");
  finder.find(d.memFree, "cuMemFree_v2");
  finder.find(d.memHostAlloc, "cuMemHostAlloc");
  finder.find(d.memFreeHost, "cuMemFreeHost");
  finder.find(d.memcpyAsync, "cuMemcpyAsync");
  finder.find(d.ipcGetMemHandle, "cuIpcGetMemHandle");
  finder.find(d.ipcOpenMemHandle, "cuIpcOpenMemHandle_v2");
  finder.find(d.ipcCloseMemHandle, "cuIpcCloseMemHandle");
  finder.find(d.eventCreate, "cuEventCreate");
  finder.find(d.eventDestroy, "cuEventDestroy_v2");
  finder.find(d.eventRecord, "cuEventRecord");
  finder.find(d.eventQuery, "cuEventQuery");
  finder.find(d.ipcGetEventHandle, "cuIpcGetEventHandle");
  finder.find(d.ipcOpenEventHandle, "cuIpcOpenEventHandle");
  finder.find(d.getErrorString, "cuGetErrorString");
  if (!finder.missing.empty()) {
    why = finder.missing;
    return nullptr;
  }
  cudadriver::EntryFinder vmm;
  vmm.find(d.deviceGetAttribute, "cuDeviceGetAttribute");
  vmm.find(d.memCreate, "cuMemCreate");
  vmm.find(d.memRelease, "cuMemRelease");
  vmm.find(d.memAddressReserve, "cuMemAddressReserve");
  vmm.find(d.memAddressFree, "cuMemAddressFree");
  vmm.find(d.memMap, "cuMemMap");
  vmm.find(d.memUnmap, "cuMemUnmap");
  vmm.find(d.memSetAccess, "cuMemSetAccess");
  vmm.find(d.memGetAllocationGranularity, "cuMemGetAllocationGranularity");
  vmm.find(d.memExportToShareableHandle, "cuMemExportToShareableHandle");
  vmm.find(d.memImportFromShareableHandle, "cuMemImportFromShareableHandle");
  d.vmm = vmm.missing.empty();
  loaded = d;
  found = true;
  return &loaded;
}

}  // namespace

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

  ~PrimaryContext() { (void)driver_.primaryCtxRelease(device_); }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  const Driver& driver() const { return driver_; }
  CuDevice device() const { return device_; }

  // Runs `work` (returning a Status) with the context current on this
  // thread, then restores the thread's own.
  template <typename Work>
  Status run(std::string_view what, Work&& work) const {
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
};

namespace {

class DriverMemory final : public DeviceMemory {
 public:
  // kMapped: cuMem memory mapped at an address reserved for it (this
  // process's own, exported as a file descriptor, or a peer's imported).
  enum class Origin { kAllocated, kOpened, kMapped };

  DriverMemory(std::shared_ptr<const PrimaryContext> context, DevicePtr pointer, Origin origin,
               size_t mappedBytes = 0)
      : context_(std::move(context)),
        pointer_(pointer),
        origin_(origin),
        mappedBytes_(mappedBytes) {}
  ~DriverMemory() override {
    // Peers that have not fetched the descriptor yet get a refusal from now on.
    if (server_) server_->withdraw(offer_);
    const Driver& d = context_->driver();
    (void)context_->call("", [&] {
      switch (origin_) {
        case Origin::kOpened:
          return d.ipcCloseMemHandle(pointer_);
        case Origin::kMapped: {
          const CuResult r = d.memUnmap(pointer_, mappedBytes_);
          const CuResult f = d.memAddressFree(pointer_, mappedBytes_);
          return r != kSuccess ? r : f;
        }
        case Origin::kAllocated:
          break;
      }
      return d.memFree(pointer_);
    });
  }
  DriverMemory(const DriverMemory&) = delete;
  DriverMemory& operator=(const DriverMemory&) = delete;

  void* data() const override { return reinterpret_cast<void*>(static_cast<uintptr_t>(pointer_)); }
  const IpcHandle& handle() const override { return handle_; }

  IpcHandle handle_;
  // The descriptor offered to peers, for memory exported as one.
  std::shared_ptr<FdServer> server_;
  uint64_t offer_ = 0;

 private:
  std::shared_ptr<const PrimaryContext> context_;
  DevicePtr pointer_;
  Origin origin_;
  size_t mappedBytes_;
};

// Reserves an address range for `allocation` (`bytes`, a multiple of the
// granularity), maps it there, and lets this GPU read and write it; the
// range is undone if a step fails. Call with the context current.
CuResult mapAllocation(const Driver& d, CuDevice device, CuMemHandle allocation, size_t bytes,
                       DevicePtr* pointer) {
  DevicePtr reserved = 0;
  if (CuResult r = d.memAddressReserve(&reserved, bytes, 0, 0, 0); r != kSuccess) return r;
  if (CuResult r = d.memMap(reserved, bytes, 0, allocation, 0); r != kSuccess) {
    (void)d.memAddressFree(reserved, bytes);
    return r;
  }
  const CuMemAccessDesc access{{kLocationDevice, device}, kAccessReadWrite};
  if (CuResult r = d.memSetAccess(reserved, bytes, &access, 1); r != kSuccess) {
    (void)d.memUnmap(reserved, bytes);
    (void)d.memAddressFree(reserved, bytes);
    return r;
  }
  *pointer = reserved;
  return kSuccess;
}

class DriverHostMemory final : public HostMemory {
 public:
  DriverHostMemory(std::shared_ptr<const PrimaryContext> context, void* data)
      : context_(std::move(context)), data_(data) {}
  ~DriverHostMemory() override {
    const Driver& d = context_->driver();
    (void)context_->call("", [&] { return d.memFreeHost(data_); });
  }
  DriverHostMemory(const DriverHostMemory&) = delete;
  DriverHostMemory& operator=(const DriverHostMemory&) = delete;

  void* data() const override { return data_; }

 private:
  std::shared_ptr<const PrimaryContext> context_;
  void* data_;
};

class DriverEvent final : public DeviceEvent {
 public:
  DriverEvent(std::shared_ptr<const PrimaryContext> context, CuEvent event)
      : context_(std::move(context)), event_(event) {}
  ~DriverEvent() override {
    const Driver& d = context_->driver();
    (void)context_->call("", [&] { return d.eventDestroy(event_); });
  }
  DriverEvent(const DriverEvent&) = delete;
  DriverEvent& operator=(const DriverEvent&) = delete;

  const IpcHandle& handle() const override { return handle_; }
  CuEvent event() const { return event_; }

  IpcHandle handle_;

 private:
  std::shared_ptr<const PrimaryContext> context_;
  CuEvent event_;
};

// Only this device's events carry a CUevent.
Result<CuEvent> cudaEventOf(DeviceEvent& event, std::string_view what) {
  auto* own = dynamic_cast<DriverEvent*>(&event);
  if (own == nullptr)
    return invalidUsage(strCat(what, ": the event is not one of a CUDA device (DriverIpcDevice)"));
  return own->event();
}

}  // namespace
}  // namespace driver_ipc

using driver_ipc::DriverEvent;
using driver_ipc::DriverMemory;

Result<std::unique_ptr<DriverIpcDevice>> DriverIpcDevice::create(int deviceOrdinal,
                                                                 Handles handles) {
  std::string why;
  const driver_ipc::Driver* d = driver_ipc::loadDriver(why);
  if (d == nullptr)
    return notSupported(
        strCat("cuda_ipc needs the CUDA driver of a process that uses a GPU: ", why));
  BRAID_ASSIGN_OR_RETURN(auto context, driver_ipc::PrimaryContext::retain(*d, deviceOrdinal));
  bool fdExports = false;
  if (handles != Handles::kLegacy && d->vmm) {
    int vmm = 0, fds = 0;
    BRAID_RETURN_IF_ERROR(
        context->call("cuda_ipc: asking whether the GPU exports descriptors", [&] {
          driver_ipc::CuResult r =
              d->deviceGetAttribute(&vmm, driver_ipc::kAttributeVmm, context->device());
          if (r == driver_ipc::kSuccess)
            r = d->deviceGetAttribute(&fds, driver_ipc::kAttributePosixFdHandles,
                                      context->device());
          return r;
        }));
    fdExports = vmm != 0 && fds != 0;
  }
  if (handles == Handles::kPosixFd && !fdExports)
    return notSupported(strCat("cuda_ipc: GPU ", deviceOrdinal,
                               " cannot export its memory as a file descriptor (cuMem), or the "
                               "driver is older than CUDA 10.2; BRAID_CUDA_IPC_HANDLES=legacy "
                               "uses legacy CUDA IPC handles"));
  std::unique_ptr<DriverIpcDevice> device(new DriverIpcDevice(*d, std::move(context), handles));
  device->fdExports_ = fdExports;
  // Non-blocking: work the application queues on the legacy default stream
  // neither waits for the transport's copies nor holds them.
  BRAID_RETURN_IF_ERROR(device->context_->call("cuda_ipc: creating the device's stream", [&] {
    return d->streamCreate(&device->stream_, driver_ipc::kStreamNonBlocking);
  }));
  return device;
}

DriverIpcDevice::DriverIpcDevice(const driver_ipc::Driver& driver,
                                 std::shared_ptr<const driver_ipc::PrimaryContext> context,
                                 Handles handles)
    : driver_(driver), context_(std::move(context)), handles_(handles) {}

bool DriverIpcDevice::exportsFds() const {
  std::lock_guard lock(mutex_);
  return fdExports_;
}

DriverIpcDevice::~DriverIpcDevice() {
  // The driver lets the stream's queued work finish before it frees it.
  if (stream_ != nullptr) (void)context_->call("", [&] { return driver_.streamDestroy(stream_); });
}

Result<std::unique_ptr<DeviceMemory>> DriverIpcDevice::allocate(size_t bytes) {
  if (bytes == 0) return invalidArgument("cuda_ipc: allocating 0 bytes of GPU memory");
  if (exportsFds()) {
    auto memory = allocateExportingFd(bytes);
    if (memory.isOk() || handles_ == Handles::kPosixFd) return memory;
    // kAuto: a GPU that says it exports descriptors but fails to (a
    // container without the right to, say) still has legacy handles.
    BRAID_INFO("cuda_ipc: exporting GPU memory as a file descriptor failed (",
               memory.status().message(), "); using legacy CUDA IPC handles from now on");
    std::lock_guard lock(mutex_);
    fdExports_ = false;
  }
  std::unique_ptr<DriverMemory> memory;
  BRAID_RETURN_IF_ERROR(
      context_->call(strCat("cuda_ipc: allocating ", bytes, " bytes of GPU memory"), [&] {
        driver_ipc::DevicePtr pointer = 0;
        const driver_ipc::CuResult r = driver_.memAlloc(&pointer, bytes);
        if (r == driver_ipc::kSuccess)
          memory =
              std::make_unique<DriverMemory>(context_, pointer, DriverMemory::Origin::kAllocated);
        return r;
      }));
  driver_ipc::CuIpcMemHandle handle{};
  BRAID_RETURN_IF_ERROR(context_->call("cuda_ipc: exporting GPU memory (cuIpcGetMemHandle)", [&] {
    return driver_.ipcGetMemHandle(&handle, driver_ipc::devicePointer(memory->data()));
  }));
  memory->handle_ = driver_ipc::fromCuda(handle);
  return std::unique_ptr<DeviceMemory>(std::move(memory));
}

Result<std::unique_ptr<DeviceMemory>> DriverIpcDevice::allocateExportingFd(size_t bytes) {
  const std::string what = strCat("cuda_ipc: allocating ", bytes, " bytes of GPU memory (cuMem)");
  if (!driver_.vmm) return notSupported(strCat(what, ": the driver has no cuMem calls"));
  driver_ipc::CuMemAllocationProp prop{};
  prop.type = driver_ipc::kAllocationPinned;
  prop.requestedHandleTypes = driver_ipc::kHandleTypePosixFd;
  prop.location = {driver_ipc::kLocationDevice, context_->device()};
  std::unique_ptr<DriverMemory> memory;
  int exported = -1;
  size_t mapped = 0;
  BRAID_RETURN_IF_ERROR(context_->run(what, [&]() -> Status {
    size_t granularity = 0;
    driver_ipc::CuResult r =
        driver_.memGetAllocationGranularity(&granularity, &prop, driver_ipc::kGranularityMinimum);
    if (r != driver_ipc::kSuccess) return driver_.error(r, strCat(what, ": its granularity"));
    if (granularity == 0) granularity = 1;
    mapped = (bytes + granularity - 1) / granularity * granularity;
    driver_ipc::CuMemHandle allocation = 0;
    if (r = driver_.memCreate(&allocation, mapped, &prop, 0); r != driver_ipc::kSuccess)
      return driver_.error(r, what);
    driver_ipc::DevicePtr pointer = 0;
    r = driver_ipc::mapAllocation(driver_, context_->device(), allocation, mapped, &pointer);
    if (r == driver_ipc::kSuccess) {
      memory =
          std::make_unique<DriverMemory>(context_, pointer, DriverMemory::Origin::kMapped, mapped);
      r = driver_.memExportToShareableHandle(&exported, allocation, driver_ipc::kHandleTypePosixFd,
                                             0);
    }
    // The mapping keeps the memory, and the descriptor names it: the
    // allocation's own handle is no longer needed.
    (void)driver_.memRelease(allocation);
    return r == driver_ipc::kSuccess ? Status::ok() : driver_.error(r, what);
  }));
  std::shared_ptr<FdServer> server;
  {
    std::lock_guard lock(mutex_);
    if (!fdServer_) {
      auto started = FdServer::start();
      if (!started.isOk()) {
        (void)close(exported);
        return started.status();
      }
      fdServer_ = std::move(started).value();
    }
    server = fdServer_;
  }
  BRAID_ASSIGN_OR_RETURN(FdTicket ticket, server->offer(tcp::Fd(exported)));
  memory->server_ = std::move(server);
  memory->offer_ = ticket.id;
  const driver_ipc::FdMemoryHandle contents{ticket, mapped};
  memory->handle_.scheme = IpcHandle::Scheme::kPosixFd;
  std::memcpy(memory->handle_.bytes.data(), &contents, sizeof(contents));
  return std::unique_ptr<DeviceMemory>(std::move(memory));
}

Result<std::unique_ptr<DeviceMemory>> DriverIpcDevice::openFdMemory(const IpcHandle& handle) {
  const std::string what = "cuda_ipc: opening a peer's GPU memory (cuMem)";
  if (!driver_.vmm) return notSupported(strCat(what, ": the driver has no cuMem calls"));
  driver_ipc::FdMemoryHandle contents;
  std::memcpy(&contents, handle.bytes.data(), sizeof(contents));
  if (contents.bytes == 0) return remoteError(strCat(what, ": a handle of 0 bytes"));
  BRAID_ASSIGN_OR_RETURN(tcp::Fd fd, fetchFd(contents.ticket));
  std::unique_ptr<DriverMemory> memory;
  BRAID_RETURN_IF_ERROR(context_->run(what, [&]() -> Status {
    driver_ipc::CuMemHandle allocation = 0;
    driver_ipc::CuResult r = driver_.memImportFromShareableHandle(
        &allocation, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
        driver_ipc::kHandleTypePosixFd);
    if (r != driver_ipc::kSuccess) return driver_.error(r, what);
    driver_ipc::DevicePtr pointer = 0;
    r = driver_ipc::mapAllocation(driver_, context_->device(), allocation, contents.bytes,
                                  &pointer);
    if (r == driver_ipc::kSuccess)
      memory = std::make_unique<DriverMemory>(context_, pointer, DriverMemory::Origin::kMapped,
                                              contents.bytes);
    (void)driver_.memRelease(allocation);
    return r == driver_ipc::kSuccess ? Status::ok() : driver_.error(r, what);
  }));
  memory->handle_ = handle;
  return std::unique_ptr<DeviceMemory>(std::move(memory));
}

Result<std::unique_ptr<DeviceMemory>> DriverIpcDevice::openMemory(const IpcHandle& handle) {
  if (handle.scheme == IpcHandle::Scheme::kPosixFd) return openFdMemory(handle);
  if (handle.scheme != IpcHandle::Scheme::kCudaIpc)
    return remoteError("cuda_ipc: a peer's GPU memory handle of an unknown scheme");
  std::unique_ptr<DriverMemory> memory;
  BRAID_RETURN_IF_ERROR(context_->call("cuda_ipc: opening a peer's GPU memory", [&] {
    driver_ipc::DevicePtr pointer = 0;
    const driver_ipc::CuResult r =
        driver_.ipcOpenMemHandle(&pointer, driver_ipc::toCuda<driver_ipc::CuIpcMemHandle>(handle),
                                 driver_ipc::kIpcMemLazyEnablePeerAccess);
    if (r == driver_ipc::kSuccess)
      memory = std::make_unique<DriverMemory>(context_, pointer, DriverMemory::Origin::kOpened);
    return r;
  }));
  memory->handle_ = handle;
  return std::unique_ptr<DeviceMemory>(std::move(memory));
}

Result<std::unique_ptr<DeviceEvent>> DriverIpcDevice::createEvent() {
  std::unique_ptr<DriverEvent> event;
  BRAID_RETURN_IF_ERROR(context_->call("cuda_ipc: creating an interprocess event", [&] {
    driver_ipc::CuEvent created = nullptr;
    const driver_ipc::CuResult r = driver_.eventCreate(
        &created, driver_ipc::kEventDisableTiming | driver_ipc::kEventInterprocess);
    if (r == driver_ipc::kSuccess) event = std::make_unique<DriverEvent>(context_, created);
    return r;
  }));
  driver_ipc::CuIpcEventHandle handle{};
  BRAID_RETURN_IF_ERROR(context_->call("cuda_ipc: exporting an event (cuIpcGetEventHandle)", [&] {
    return driver_.ipcGetEventHandle(&handle, event->event());
  }));
  event->handle_ = driver_ipc::fromCuda(handle);
  return std::unique_ptr<DeviceEvent>(std::move(event));
}

Result<std::unique_ptr<DeviceEvent>> DriverIpcDevice::openEvent(const IpcHandle& handle) {
  std::unique_ptr<DriverEvent> event;
  BRAID_RETURN_IF_ERROR(context_->call("cuda_ipc: opening a peer's event", [&] {
    driver_ipc::CuEvent opened = nullptr;
    const driver_ipc::CuResult r = driver_.ipcOpenEventHandle(
        &opened, driver_ipc::toCuda<driver_ipc::CuIpcEventHandle>(handle));
    if (r == driver_ipc::kSuccess) event = std::make_unique<DriverEvent>(context_, opened);
    return r;
  }));
  event->handle_ = handle;
  return std::unique_ptr<DeviceEvent>(std::move(event));
}

Result<std::unique_ptr<HostMemory>> DriverIpcDevice::allocateHost(size_t bytes) {
  if (bytes == 0) return invalidArgument("cuda_ipc: allocating 0 bytes of pinned host memory");
  std::unique_ptr<HostMemory> memory;
  BRAID_RETURN_IF_ERROR(
      context_->call(strCat("allocating ", bytes, " bytes of pinned host memory"), [&] {
        void* data = nullptr;
        const driver_ipc::CuResult r =
            driver_.memHostAlloc(&data, bytes, driver_ipc::kHostAllocPortableMapped);
        if (r == driver_ipc::kSuccess)
          memory = std::make_unique<driver_ipc::DriverHostMemory>(context_, data);
        return r;
      }));
  return memory;
}

Status DriverIpcDevice::enqueueCopy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::ok();
  return context_->call("cuda_ipc: queueing a copy", [&] {
    return driver_.memcpyAsync(driver_ipc::devicePointer(dst), driver_ipc::devicePointer(src),
                               bytes, stream_);
  });
}

Status DriverIpcDevice::enqueueCombine(void* dst, const void* local, const void* incoming,
                                       size_t bytes, const Combiner& combiner) {
  if (combiner.applyOnDevice == nullptr)
    return notSupported(
        "cuda_ipc: reductions of GPU memory are not built into this braid (it was built without "
        "CUDA device code)");
  if (combiner.unit == 0 || bytes % combiner.unit != 0)
    return invalidArgument(
        strCat("cuda_ipc: combining ", bytes, " bytes in elements of ", combiner.unit, " bytes"));
  if (bytes == 0) return Status::ok();
  // The combiner launches a kernel, which goes to the current context.
  return context_->run("cuda_ipc: queueing a reduction", [&] {
    return combiner.applyOnDevice(dst, local, incoming, bytes / combiner.unit, combiner.context,
                                  stream_);
  });
}

Status DriverIpcDevice::enqueueRecord(DeviceEvent& event) {
  constexpr std::string_view kWhat = "cuda_ipc: queueing an event's record";
  BRAID_ASSIGN_OR_RETURN(driver_ipc::CuEvent e, driver_ipc::cudaEventOf(event, kWhat));
  return context_->call(kWhat, [&] { return driver_.eventRecord(e, stream_); });
}

Status DriverIpcDevice::enqueueWait(DeviceEvent& event) {
  constexpr std::string_view kWhat = "cuda_ipc: queueing a wait for an event";
  BRAID_ASSIGN_OR_RETURN(driver_ipc::CuEvent e, driver_ipc::cudaEventOf(event, kWhat));
  return context_->call(kWhat, [&] { return driver_.streamWaitEvent(stream_, e, 0); });
}

Result<bool> DriverIpcDevice::hasRun(DeviceEvent& event) {
  constexpr std::string_view kWhat = "querying an event of the GPU's stream";
  BRAID_ASSIGN_OR_RETURN(driver_ipc::CuEvent e, driver_ipc::cudaEventOf(event, kWhat));
  bool done = false;
  BRAID_RETURN_IF_ERROR(context_->call(kWhat, [&] {
    const driver_ipc::CuResult r = driver_.eventQuery(e);
    done = r == driver_ipc::kSuccess;
    return r == driver_ipc::kNotReady ? driver_ipc::kSuccess : r;
  }));
  return done;
}

Status DriverIpcDevice::synchronize() {
  return context_->call("cuda_ipc: the GPU work of the transport",
                        [&] { return driver_.streamSynchronize(stream_); });
}

}  // namespace braid::transport::cuda_ipc
