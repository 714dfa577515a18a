// GPU memory that the ranks of this host read in place with no rule on
// when it may be freed: what braidMemAlloc hands out.
//
// A peer that reads a cudaMalloc buffer in place opens it with a legacy
// CUDA IPC handle, and CUDA leaves it undefined to free such memory while
// another process has it open; so reading those in place waits for the
// caller's promise that every GPU buffer outlives the communicator
// (BRAID_CUDA_IPC_DIRECT_BYTES). This memory is made with cuMem and
// exported as a POSIX file descriptor instead: a peer maps the physical
// allocation, and cuMem frees it only once every mapping of it is gone. The
// owner may free it whenever no call using it is in flight, as any memory.
//
// The descriptor of each allocation is offered at allocation time by one
// FdServer of the process (fd_handoff.h), so that finding the export of a
// buffer needs no driver call and may be done while a CUDA stream waits for
// a call (sharedGpuRange).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "src/common/status.h"
#include "transports/cuda_ipc/driver_api.h"
#include "transports/cuda_ipc/ipc_device.h"
#include "transports/tcp/socket.h"

namespace braid::transport::cuda_ipc {

// `bytes` of memory on the GPU of the calling thread's current CUDA context
// (GPU 0 where it has none, as the CUDA runtime would pick), not zeroed.
// Where the GPU or driver cannot export cuMem memory as a descriptor, plain
// cuMemAlloc memory, which works everywhere but is not read in place unless
// BRAID_CUDA_IPC_DIRECT_BYTES says every buffer may be.
// kNotSupported where the process has not loaded a CUDA driver.
Result<void*> allocateSharedGpuMemory(size_t bytes);

// Frees memory of allocateSharedGpuMemory; kInvalidArgument for any other
// pointer. A peer that mapped it keeps its pages until it unmaps them.
Status freeSharedGpuMemory(void* data);

// Where [data, data + bytes) lies, if it lies inside one descriptor-exported
// allocation of allocateSharedGpuMemory (peerHoldsMemory set); nothing
// otherwise. No driver call; any thread.
std::optional<ExportedRange> sharedGpuRange(const void* data, size_t bytes);

// Whether `data` lies in an allocation of allocateSharedGpuMemory of any
// kind: one made without a descriptor (cuMemAlloc memory) is never exported
// with a legacy handle either, since its owner may free it at any time.
bool insideSharedGpuMemory(const void* data);

// The GPU of ordinal `device` has work that never finished (a wedged
// context, DriverIpcDevice::synchronize): freeSharedGpuMemory leaves the
// memory allocated on it so far mapped, since that work may still use it.
void abandonSharedGpuMemoryOf(int device);

// How many descriptor-exported allocations of allocateSharedGpuMemory were
// freed so far in this process and, where more than `seen`, the ids among
// `named` that are no longer allocated appended to `freed`: how a
// connection tells its peers which allocations they may unmap, however
// many were freed since it last looked. Takes no lock when none was freed
// since.
uint64_t sharedGpuMemoryFreedSince(uint64_t seen, const std::set<uint64_t>& named,
                                   std::vector<uint64_t>& freed);

namespace driver_ipc {

// Reserves an address range for `allocation` (`bytes`, a multiple of the
// granularity), maps it there, and lets GPU `device` read and write it; the
// range is undone if a step fails. Call with a context current.
CuResult mapAllocation(const Driver& d, CuDevice device, CuMemHandle allocation, size_t bytes,
                       DevicePtr* pointer);

// Whether the context's GPU and the driver export cuMem memory as POSIX
// file descriptors.
Result<bool> exportsDescriptors(const Driver& d, const PrimaryContext& context);

// cuMem memory of at least `bytes` on the context's GPU, mapped here and
// exported as a POSIX file descriptor.
struct FdExportedMemory {
  DevicePtr pointer = 0;
  size_t mappedBytes = 0;  // `bytes` rounded up to the allocation granularity
  tcp::Fd fd;
};
Result<FdExportedMemory> createFdExportedMemory(const Driver& d, const PrimaryContext& context,
                                                size_t bytes);

// Unmaps and frees the address range of createFdExportedMemory or of an
// imported descriptor. Call with a context current.
CuResult unmapAllocation(const Driver& d, DevicePtr pointer, size_t mappedBytes);

}  // namespace driver_ipc
}  // namespace braid::transport::cuda_ipc
