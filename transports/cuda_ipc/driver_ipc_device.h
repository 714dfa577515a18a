// The IpcDevice of a real GPU, over the CUDA driver API of the libcuda.so.1
// the process has loaded (src/common/cuda_driver.h): braid never loads the
// driver itself, and needs no CUDA header to build this.
//
// A device retains the GPU's primary context, the one the CUDA runtime uses,
// so that memory the application allocated with cudaMalloc and the
// device's own memory live in one context. Each call makes that context
// current for its own duration only, so callers need none, and a context
// the caller has current is left as it was.
//
// Memory and events keep the context retained themselves, so they may
// outlive the device that made them; queued work that uses them must have
// run before they go (synchronize()).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "src/common/status.h"
#include "transports/cuda_ipc/ipc_device.h"

namespace braid::transport::cuda_ipc {

class FdServer;

namespace driver_ipc {
struct Driver;
class PrimaryContext;
}  // namespace driver_ipc

class DriverIpcDevice final : public IpcDevice {
 public:
  // How allocate() exports memory. kPosixFd: cuMem memory exported as a
  // POSIX file descriptor, handed to peers through fd_handoff.h; kLegacy:
  // cuMemAlloc memory and a legacy CUDA IPC handle; kAuto: kPosixFd where
  // the driver and GPU support it, else kLegacy. Either kind of handle
  // opens on any device (openMemory follows the handle's scheme).
  enum class Handles { kAuto, kLegacy, kPosixFd };

  // The device of CUDA ordinal `deviceOrdinal`, with a non-blocking stream
  // of its own. kNotSupported where the process has no CUDA driver loaded,
  // or for kPosixFd where the GPU cannot export file descriptors.
  static Result<std::unique_ptr<DriverIpcDevice>> create(int deviceOrdinal,
                                                         Handles handles = Handles::kAuto);
  ~DriverIpcDevice() override;

  DriverIpcDevice(const DriverIpcDevice&) = delete;
  DriverIpcDevice& operator=(const DriverIpcDevice&) = delete;

  Result<std::unique_ptr<DeviceMemory>> allocate(size_t bytes) override;
  Result<std::unique_ptr<DeviceMemory>> allocateUnshared(size_t bytes) override;
  Result<std::unique_ptr<DeviceMemory>> openMemory(const IpcHandle& handle) override;
  Result<std::unique_ptr<DeviceEvent>> createEvent() override;
  Result<std::unique_ptr<DeviceEvent>> createUnsharedEvent() override;
  Result<std::unique_ptr<DeviceEvent>> openEvent(const IpcHandle& handle) override;
  Result<std::unique_ptr<HostMemory>> allocateHost(size_t bytes) override;
  // The legacy CUDA IPC handle of the cuMemAlloc (cudaMalloc) allocation
  // that holds the buffer; memory of cuMemCreate or of a memory pool has
  // none, and is refused.
  Result<ExportedRange> exportRange(const void* data, size_t bytes) override;
  Result<ExportedRange> exportedRange(const void* data, size_t bytes) override;
  // braidMemAlloc's memory freed (shared_gpu_memory.h).
  uint64_t heldFreedSince(uint64_t seen, const std::set<uint64_t>& named,
                          std::vector<uint64_t>& freed) override;
  std::optional<bool> sharedThroughMps() const override { return sharedThroughMps_; }

  Status enqueueCopy(void* dst, const void* src, size_t bytes) override;
  Status enqueueCombine(void* dst, const void* local, const void* incoming, size_t bytes,
                        const Combiner& combiner) override;
  Status enqueueRecord(DeviceEvent& event) override;
  Status enqueueWait(DeviceEvent& event) override;
  Result<bool> hasRun(DeviceEvent& event) override;
  // Fails with kTimeout once the stream's work has taken `seconds` (300
  // unless set), and then leaves this device's memory, events and context
  // unfreed (PrimaryContext::markWedged).
  Status synchronize() override;
  void setSynchronizeLimit(double seconds);

  // Runs `work` with the GPU's context current on this thread (for the
  // caller's own CUDA runtime calls), then restores the thread's own.
  Status runInContext(std::string_view what, const std::function<Status()>& work) const;

  // The CUstream all work is queued on.
  void* stream() const { return stream_; }
  // Whether allocate() exports file descriptors (cuMem) now.
  bool exportsFds() const;

 private:
  DriverIpcDevice(const driver_ipc::Driver& driver,
                  std::shared_ptr<const driver_ipc::PrimaryContext> context, Handles handles);
  Result<std::unique_ptr<DeviceMemory>> allocateExportingFd(size_t bytes);
  Result<std::unique_ptr<DeviceMemory>> openFdMemory(const IpcHandle& handle);

  const driver_ipc::Driver& driver_;
  std::shared_ptr<const driver_ipc::PrimaryContext> context_;
  const Handles handles_;
  void* stream_ = nullptr;
  mutable std::mutex mutex_;
  double synchronizeLimitSeconds_ = 300;
  bool fdExports_ = false;                // what kAuto settled on, or kPosixFd
  std::optional<bool> sharedThroughMps_;  // nothing: the driver does not say
  std::shared_ptr<FdServer> fdServer_;    // started at the first such export
  struct Exported {
    size_t bytes;         // of the allocation
    ExportedRange range;  // at offset 0
  };
  std::map<uintptr_t, Exported> exported_;  // by allocation base, under mutex_
};

}  // namespace braid::transport::cuda_ipc
