#include "transports/cuda_ipc/driver_ipc_device.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "src/common/log.h"
#include "src/common/poll_until.h"
#include "src/common/strcat.h"
#include "transports/cuda_ipc/driver_api.h"
#include "transports/cuda_ipc/fd_handoff.h"
#include "transports/cuda_ipc/shared_gpu_memory.h"

namespace braid::transport::cuda_ipc {
namespace driver_ipc {
namespace {

// What a wedged context's GPU may still use (PrimaryContext::markWedged):
// never freed, but kept here, so that it stays reachable and a leak checker
// sees it held on purpose.
void abandon(const void* handle) {
  static std::mutex mutex;
  static auto* kept = new std::vector<const void*>;
  std::lock_guard lock(mutex);
  kept->push_back(handle);
}

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
    if (context_->wedged()) {  // the GPU may still use it: left as it is
      abandon(reinterpret_cast<const void*>(static_cast<uintptr_t>(pointer_)));
      return;
    }
    const Driver& d = context_->driver();
    (void)context_->call("", [&] {
      switch (origin_) {
        case Origin::kOpened:
          return d.ipcCloseMemHandle(pointer_);
        case Origin::kMapped:
          return unmapAllocation(d, pointer_, mappedBytes_);
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
  size_t bytes() const override { return origin_ == Origin::kMapped ? mappedBytes_ : knownBytes_; }

  IpcHandle handle_;
  size_t knownBytes_ = 0;  // of an opened allocation, as the driver says
  // The descriptor offered to peers, for memory exported as one.
  std::shared_ptr<FdServer> server_;
  uint64_t offer_ = 0;

 private:
  std::shared_ptr<const PrimaryContext> context_;
  DevicePtr pointer_;
  Origin origin_;
  size_t mappedBytes_;
};

class DriverHostMemory final : public HostMemory {
 public:
  DriverHostMemory(std::shared_ptr<const PrimaryContext> context, void* data)
      : context_(std::move(context)), data_(data) {}
  ~DriverHostMemory() override {
    if (context_->wedged()) {  // the GPU may still copy to or from it
      abandon(data_);
      return;
    }
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
    if (context_->wedged()) {
      abandon(event_);
      return;
    }
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

// cuMemAlloc memory, not exported yet.
Result<std::unique_ptr<DriverMemory>> allocateWithMemAlloc(
    const Driver& driver, const std::shared_ptr<const PrimaryContext>& context, size_t bytes) {
  std::unique_ptr<DriverMemory> memory;
  BRAID_RETURN_IF_ERROR(
      context->call(strCat("cuda_ipc: allocating ", bytes, " bytes of GPU memory"), [&] {
        DevicePtr pointer = 0;
        const CuResult r = driver.memAlloc(&pointer, bytes);
        if (r == kSuccess)
          memory =
              std::make_unique<DriverMemory>(context, pointer, DriverMemory::Origin::kAllocated);
        return r;
      }));
  return memory;
}

// An event without timing, and with `extraFlags` (CU_EVENT_*), not exported yet.
Result<std::unique_ptr<DriverEvent>> createDriverEvent(
    const Driver& driver, const std::shared_ptr<const PrimaryContext>& context,
    unsigned extraFlags) {
  std::unique_ptr<DriverEvent> event;
  BRAID_RETURN_IF_ERROR(context->call(
      (extraFlags & kEventInterprocess) != 0 ? "cuda_ipc: creating an interprocess event"
                                             : "cuda_ipc: creating an event",
      [&] {
        CuEvent created = nullptr;
        const CuResult r = driver.eventCreate(&created, kEventDisableTiming | extraFlags);
        if (r == kSuccess) event = std::make_unique<DriverEvent>(context, created);
        return r;
      }));
  return event;
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
  if (handles != Handles::kLegacy) {
    auto exports = driver_ipc::exportsDescriptors(*d, *context);
    if (!exports.isOk())
      return Status(exports.status().code(), strCat("cuda_ipc: ", exports.status().message()));
    fdExports = *exports;
  }
  if (handles == Handles::kPosixFd && !fdExports)
    return notSupported(strCat("cuda_ipc: GPU ", deviceOrdinal,
                               " cannot export its memory as a file descriptor (cuMem), or the "
                               "driver is older than CUDA 10.2; BRAID_CUDA_IPC_HANDLES=legacy "
                               "uses legacy CUDA IPC handles"));
  // Asked once: whether the processes that share this GPU run at once.
  std::optional<bool> mps;
  if (d->deviceGetAttribute != nullptr) {
    int enabled = 0;
    if (d->deviceGetAttribute(&enabled, driver_ipc::kAttributeMpsEnabled, context->device()) ==
        driver_ipc::kSuccess)
      mps = enabled != 0;
  }
  std::unique_ptr<DriverIpcDevice> device(new DriverIpcDevice(*d, std::move(context), handles));
  device->fdExports_ = fdExports;
  device->sharedThroughMps_ = mps;
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
  if (stream_ != nullptr && !context_->wedged())
    (void)context_->call("", [&] { return driver_.streamDestroy(stream_); });
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
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<DriverMemory> memory,
                         driver_ipc::allocateWithMemAlloc(driver_, context_, bytes));
  driver_ipc::CuIpcMemHandle handle{};
  BRAID_RETURN_IF_ERROR(context_->call("cuda_ipc: exporting GPU memory (cuIpcGetMemHandle)", [&] {
    return driver_.ipcGetMemHandle(&handle, driver_ipc::devicePointer(memory->data()));
  }));
  memory->handle_ = driver_ipc::fromCuda(handle);
  return std::unique_ptr<DeviceMemory>(std::move(memory));
}

Result<ExportedRange> DriverIpcDevice::exportedRange(const void* data, size_t bytes) {
  // braidMemAlloc's memory is exported when it is made, as a descriptor,
  // which BRAID_CUDA_IPC_HANDLES=legacy says peers cannot fetch.
  if (handles_ != Handles::kLegacy)
    if (auto shared = sharedGpuRange(data, bytes)) return *shared;
  const auto address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard lock(mutex_);
  auto it = exported_.upper_bound(address);
  if (it == exported_.begin() || (--it, address - it->first > it->second.bytes) ||
      bytes > it->second.bytes - (address - it->first))
    return notSupported("cuda_ipc: the buffer's allocation was not exported yet");
  ExportedRange range = it->second.range;
  range.offset = address - it->first;
  return range;
}

uint64_t DriverIpcDevice::heldFreedSince(uint64_t seen, const std::set<uint64_t>& named,
                                         std::vector<uint64_t>& freed) {
  return sharedGpuMemoryFreedSince(seen, named, freed);
}

Result<ExportedRange> DriverIpcDevice::exportRange(const void* data, size_t bytes) {
  if (auto known = exportedRange(data, bytes); known.isOk()) return known;
  // Its owner may free it while a peer has it open: never a legacy handle.
  if (insideSharedGpuMemory(data))
    return notSupported("cuda_ipc: memory of braidMemAlloc is exported only as a descriptor");
  if (driver_.memGetAddressRange == nullptr || driver_.pointerGetAttribute == nullptr)
    return notSupported("cuda_ipc: the driver cannot say which allocation holds a buffer");
  const driver_ipc::DevicePtr pointer = driver_ipc::devicePointer(data);
  driver_ipc::DevicePtr base = 0;
  size_t allocationBytes = 0;
  unsigned long long id = 0;
  driver_ipc::CuIpcMemHandle handle{};
  BRAID_RETURN_IF_ERROR(context_->call("cuda_ipc: exporting a buffer", [&] {
    driver_ipc::CuResult r = driver_.memGetAddressRange(&base, &allocationBytes, pointer);
    if (r == driver_ipc::kSuccess)
      r = driver_.pointerGetAttribute(&id, driver_ipc::kPointerAttributeBufferId, base);
    if (r == driver_ipc::kSuccess) r = driver_.ipcGetMemHandle(&handle, base);
    return r;
  }));
  if (pointer < base || bytes > allocationBytes - (pointer - base))
    return invalidArgument(
        strCat("cuda_ipc: a buffer of ", bytes, " bytes runs past the end of its allocation"));
  const ExportedRange whole{driver_ipc::fromCuda(handle), id, 0};
  {
    std::lock_guard lock(mutex_);
    exported_[static_cast<uintptr_t>(base)] = Exported{allocationBytes, whole};
  }
  ExportedRange range = whole;
  range.offset = pointer - base;
  return range;
}

Result<std::unique_ptr<DeviceMemory>> DriverIpcDevice::allocateUnshared(size_t bytes) {
  if (bytes == 0) return invalidArgument("cuda_ipc: allocating 0 bytes of GPU memory");
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<DriverMemory> memory,
                         driver_ipc::allocateWithMemAlloc(driver_, context_, bytes));
  return std::unique_ptr<DeviceMemory>(std::move(memory));
}

Result<std::unique_ptr<DeviceMemory>> DriverIpcDevice::allocateExportingFd(size_t bytes) {
  auto made = driver_ipc::createFdExportedMemory(driver_, *context_, bytes);
  if (!made.isOk())
    return Status(made.status().code(), strCat("cuda_ipc: ", made.status().message()));
  auto memory = std::make_unique<DriverMemory>(context_, made->pointer,
                                               DriverMemory::Origin::kMapped, made->mappedBytes);
  const size_t mapped = made->mappedBytes;
  std::shared_ptr<FdServer> server;
  {
    std::lock_guard lock(mutex_);
    if (!fdServer_) {
      BRAID_ASSIGN_OR_RETURN(fdServer_, FdServer::start());
    }
    server = fdServer_;
  }
  BRAID_ASSIGN_OR_RETURN(FdTicket ticket, server->offer(std::move(made->fd)));
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
    // Its size, against which a peer's offsets are checked (reads in place).
    driver_ipc::DevicePtr base = 0;
    size_t bytes = 0;
    if (r == driver_ipc::kSuccess && driver_.memGetAddressRange != nullptr &&
        driver_.memGetAddressRange(&base, &bytes, pointer) == driver_ipc::kSuccess &&
        base == pointer)
      memory->knownBytes_ = bytes;
    return r;
  }));
  memory->handle_ = handle;
  return std::unique_ptr<DeviceMemory>(std::move(memory));
}

Result<std::unique_ptr<DeviceEvent>> DriverIpcDevice::createEvent() {
  BRAID_ASSIGN_OR_RETURN(
      std::unique_ptr<DriverEvent> event,
      driver_ipc::createDriverEvent(driver_, context_, driver_ipc::kEventInterprocess));
  driver_ipc::CuIpcEventHandle handle{};
  BRAID_RETURN_IF_ERROR(context_->call("cuda_ipc: exporting an event (cuIpcGetEventHandle)", [&] {
    return driver_.ipcGetEventHandle(&handle, event->event());
  }));
  event->handle_ = driver_ipc::fromCuda(handle);
  return std::unique_ptr<DeviceEvent>(std::move(event));
}

Result<std::unique_ptr<DeviceEvent>> DriverIpcDevice::createUnsharedEvent() {
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<DriverEvent> event,
                         driver_ipc::createDriverEvent(driver_, context_, 0));
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

Status DriverIpcDevice::runInContext(std::string_view what,
                                     const std::function<Status()>& work) const {
  return context_->run(what, work);
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

void DriverIpcDevice::setSynchronizeLimit(double seconds) {
  synchronizeLimitSeconds_ = seconds;
}

// Polled rather than cuStreamSynchronize: the stream may wait for an event
// of a peer's process that ended before its GPU ran the record, and then
// it never finishes (pollUntil).
Status DriverIpcDevice::synchronize() {
  constexpr std::string_view kWhat = "cuda_ipc: the GPU work of the transport";
  // Once a wait ran out, each later one looks once: a communicator's
  // destroy synchronizes every connection, and each would wait it out again.
  auto workRan = [&]() -> Result<bool> {
    bool ran = false;
    BRAID_RETURN_IF_ERROR(context_->call(kWhat, [&] {
      const driver_ipc::CuResult r = driver_.streamQuery(stream_);
      ran = r == driver_ipc::kSuccess;
      return r == driver_ipc::kNotReady ? driver_ipc::kSuccess : r;
    }));
    return ran;
  };
  BRAID_ASSIGN_OR_RETURN(const bool done,
                         pollUntil(workRan, context_->wedged() ? 0.0 : synchronizeLimitSeconds_));
  if (done) return Status::ok();
  context_->markWedged();
  abandonSharedGpuMemoryOf(context_->device());
  return Status(ErrorCode::kTimeout,
                strCat(kWhat, " did not finish in ", synchronizeLimitSeconds_,
                       " s (BRAID_TIMEOUT): a peer's process may have ended before its GPU "
                       "ran what this GPU waits for; its memory is no longer freed"));
}

}  // namespace braid::transport::cuda_ipc
