// What the CUDA-IPC transport needs of a GPU: memory and events that other
// processes of the host can open from a handle, and one ordered work queue
// (a CUDA stream) for the copies, reductions and event operations of every
// connection of this rank.
//
// The transport speaks only through this interface, so its protocol runs
// unchanged on a real GPU (driver_ipc_device.h) and on the tests' stand-in
// device (host memory as device memory, shared memory as handles, a thread
// as the stream).
//
// Every enqueue* call only queues work and returns; errors it reports are
// errors of queueing. Work runs in the order it was queued. Implementations
// are thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "src/common/status.h"
#include "transports/transport.h"

namespace braid::transport::cuda_ipc {

// An exported handle, opaque: CUipcMemHandle and CUipcEventHandle are both
// 64 bytes. Memory may also be exported as a POSIX file descriptor (cuMem),
// which travels beside the connection (fd_handoff.h): its bytes then say
// where to fetch it.
struct IpcHandle {
  enum class Scheme : uint32_t { kCudaIpc = 0, kPosixFd = 1 };
  Scheme scheme = Scheme::kCudaIpc;
  std::array<uint8_t, 64> bytes{};
};

// Device memory: this process's own (exported as `handle`, or unshared with
// an all-zero handle), or a peer's opened from its handle. Freed or unmapped
// when destroyed.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual void* data() const = 0;
  virtual const IpcHandle& handle() const = 0;
  // How many bytes from data() are this memory's, where known (a peer's
  // opened allocation may be larger than it said); 0: not known.
  virtual size_t bytes() const { return 0; }
};

// Page-locked host memory that the device's copies and reductions reach
// directly (cuMemHostAlloc): the bounce buffers of a transport that carries
// GPU memory over a host connection (transports/gpu_staged). Freed when
// destroyed.
class HostMemory {
 public:
  virtual ~HostMemory() = default;
  virtual void* data() const = 0;
};

// An event: this process's own (interprocess, exported as `handle`, or
// unshared with an all-zero handle), or a peer's opened from its handle. A
// wait queued on it holds later work until the work queued before
// the event's latest record (at the time of the wait) has run.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  virtual const IpcHandle& handle() const = 0;
};

// Where a buffer lies in memory a peer can open: the handle of its whole
// allocation, an id naming that allocation for as long as it lives (never
// one a later allocation takes), and the buffer's offset in it.
struct ExportedRange {
  IpcHandle handle;
  uint64_t allocationId = 0;
  uint64_t offset = 0;
  // The peer's mapping keeps the allocation's memory alive, so the owner
  // may free it while the peer has it open (shared_gpu_memory.h); false for
  // a legacy handle, whose memory must outlive the peer's use of it.
  bool peerHoldsMemory = false;
};

class IpcDevice {
 public:
  virtual ~IpcDevice() = default;

  virtual Result<std::unique_ptr<DeviceMemory>> allocate(size_t bytes) = 0;
  virtual Result<std::unique_ptr<DeviceMemory>> openMemory(const IpcHandle& handle) = 0;
  virtual Result<std::unique_ptr<DeviceEvent>> createEvent() = 0;
  // Memory and events that no peer opens (spill blocks, scratch, the
  // events of staged copies): not exported, so they hold no descriptor and
  // no handle (handle() is all zero), and memory is not rounded up to the
  // granularity of exported memory.
  virtual Result<std::unique_ptr<DeviceMemory>> allocateUnshared(size_t bytes) = 0;
  virtual Result<std::unique_ptr<DeviceEvent>> createUnsharedEvent() = 0;
  virtual Result<std::unique_ptr<DeviceEvent>> openEvent(const IpcHandle& handle) = 0;
  virtual Result<std::unique_ptr<HostMemory>> allocateHost(size_t bytes) = 0;
  // Exports the allocation that holds [data, data + bytes) (the caller's
  // own buffer, not memory of this interface), so that a peer may read
  // the bytes in place; an error where it cannot be shared (memory of
  // another kind, or allocated in a way the handles cannot carry), and the
  // caller moves the bytes another way.
  // Exported ranges are kept, by allocation, for the device's life (the
  // caller's buffers must outlive their peers' use of them).
  virtual Result<ExportedRange> exportRange(const void* data, size_t bytes) {
    (void)data;
    (void)bytes;
    return notSupported("this device exports no buffers of the caller");
  }
  // The same for a buffer in an allocation exportRange exported before,
  // with no driver call (as while a CUDA stream waits for a call); an error
  // for any other.
  virtual Result<ExportedRange> exportedRange(const void* data, size_t bytes) {
    (void)data;
    (void)bytes;
    return notSupported("this device exports no buffers of the caller");
  }
  // Allocations whose peers hold their memory (ExportedRange::
  // peerHoldsMemory) that their owner freed: the number freed so far and,
  // where that is more than `seen`, the ids among `named` that are freed
  // appended to `freed`, so a connection can tell its peer to unmap them.
  // Cheap when none was freed since.
  virtual uint64_t heldFreedSince(uint64_t seen, const std::set<uint64_t>& named,
                                  std::vector<uint64_t>& freed) {
    (void)named;
    (void)freed;
    return seen;
  }
  // Whether processes on this device share it through MPS (and so run at
  // once) rather than take turns; nothing when the driver does not say.
  virtual std::optional<bool> sharedThroughMps() const { return std::nullopt; }

  // dst = src, `bytes` of device memory (either may be a peer's) or of
  // allocateHost's memory.
  virtual Status enqueueCopy(void* dst, const void* src, size_t bytes) = 0;
  // dst = local (op) incoming, for bytes / combiner.unit elements, with the
  // combiner's device function (its host function on a stand-in device);
  // `incoming` may be allocateHost's memory.
  virtual Status enqueueCombine(void* dst, const void* local, const void* incoming, size_t bytes,
                                const Combiner& combiner) = 0;
  virtual Status enqueueRecord(DeviceEvent& event) = 0;
  virtual Status enqueueWait(DeviceEvent& event) = 0;

  // Whether the work queued before the event's latest record has run. Never
  // waits.
  virtual Result<bool> hasRun(DeviceEvent& event) = 0;

  // Waits until everything queued so far has run; the first error of the
  // queued work, if any.
  virtual Status synchronize() = 0;
};

}  // namespace braid::transport::cuda_ipc
