#include "transports/cuda_ipc/shared_gpu_memory.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "src/common/log.h"
#include "src/common/strcat.h"
#include "transports/cuda_ipc/fd_handoff.h"

namespace braid::transport::cuda_ipc {
namespace driver_ipc {

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

CuResult unmapAllocation(const Driver& d, DevicePtr pointer, size_t mappedBytes) {
  const CuResult r = d.memUnmap(pointer, mappedBytes);
  const CuResult f = d.memAddressFree(pointer, mappedBytes);
  return r != kSuccess ? r : f;
}

Result<FdExportedMemory> createFdExportedMemory(const Driver& d, const PrimaryContext& context,
                                                size_t bytes) {
  const std::string what = strCat("allocating ", bytes, " bytes of GPU memory (cuMem)");
  if (!d.vmm) return notSupported(strCat(what, ": the driver has no cuMem calls"));
  CuMemAllocationProp prop{};
  prop.type = kAllocationPinned;
  prop.requestedHandleTypes = kHandleTypePosixFd;
  prop.location = {kLocationDevice, context.device()};
  FdExportedMemory made;
  BRAID_RETURN_IF_ERROR(context.run(what, [&]() -> Status {
    size_t granularity = 0;
    CuResult r = d.memGetAllocationGranularity(&granularity, &prop, kGranularityMinimum);
    if (r != kSuccess) return d.error(r, strCat(what, ": its granularity"));
    if (granularity == 0) granularity = 1;
    if (bytes > SIZE_MAX - granularity)
      return invalidArgument(strCat(what, ": more than the address space holds"));
    const size_t mapped = (bytes + granularity - 1) / granularity * granularity;
    CuMemHandle allocation = 0;
    if (r = d.memCreate(&allocation, mapped, &prop, 0); r != kSuccess) return d.error(r, what);
    DevicePtr pointer = 0;
    r = mapAllocation(d, context.device(), allocation, mapped, &pointer);
    int exported = -1;
    if (r == kSuccess) {
      r = d.memExportToShareableHandle(&exported, allocation, kHandleTypePosixFd, 0);
      if (r == kSuccess) {
        made = {pointer, mapped, tcp::Fd(exported)};
      } else {
        (void)unmapAllocation(d, pointer, mapped);
      }
    }
    // The mapping keeps the memory, and the descriptor names it: the
    // allocation's own handle is no longer needed.
    (void)d.memRelease(allocation);
    return r == kSuccess ? Status::ok() : d.error(r, what);
  }));
  return made;
}

Result<bool> exportsDescriptors(const Driver& d, const PrimaryContext& context) {
  if (!d.vmm) return false;
  int vmm = 0, fds = 0;
  BRAID_RETURN_IF_ERROR(context.call("asking whether the GPU exports descriptors", [&] {
    CuResult r = d.deviceGetAttribute(&vmm, kAttributeVmm, context.device());
    if (r == kSuccess) r = d.deviceGetAttribute(&fds, kAttributePosixFdHandles, context.device());
    return r;
  }));
  return vmm != 0 && fds != 0;
}

}  // namespace driver_ipc

namespace {

using driver_ipc::CuResult;
using driver_ipc::kSuccess;

// Ids of these allocations: apart from the driver's buffer ids (small
// counters), with which a peer's cache of opened allocations mixes them.
constexpr uint64_t kSharedAllocationIds = uint64_t{1} << 63;

struct SharedAllocation {
  std::shared_ptr<const driver_ipc::PrimaryContext> context;
  // 0 for cuMemAlloc memory (no descriptor).
  size_t mappedBytes = 0;
  size_t bytes = 0;        // of the allocation, either kind
  ExportedRange whole;     // at offset 0, for descriptor-exported memory
  uint64_t offer = 0;      // the descriptor's id at the server
  bool abandoned = false;  // abandonSharedGpuMemoryOf
};

struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, SharedAllocation> allocations;  // by address
  std::shared_ptr<FdServer> server;                   // started at the first export
  uint64_t nextId = 1;
  // Ids of the live descriptor-exported allocations, and how many were
  // ever freed.
  std::set<uint64_t> liveIds;
  std::atomic<uint64_t> freed{0};
};

// Never destroyed: memory may be freed by a static destructor of the
// application after this file's would have run.
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

// The allocation that holds `data` and its offset there, or null (r.mutex
// held).
std::pair<const SharedAllocation*, size_t> allocationHolding(Registry& r, const void* data) {
  const auto address = reinterpret_cast<uintptr_t>(data);
  auto it = r.allocations.upper_bound(address);
  if (it == r.allocations.begin()) return {nullptr, 0};
  --it;
  const size_t offset = address - it->first;
  if (offset >= it->second.bytes) return {nullptr, 0};
  return {&it->second, offset};
}

// Offers `fd` at the process's server, started if need be.
Result<FdTicket> offer(tcp::Fd fd) {
  std::shared_ptr<FdServer> server;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (!r.server) {
      BRAID_ASSIGN_OR_RETURN(r.server, FdServer::start());
    }
    server = r.server;
  }
  return server->offer(std::move(fd));
}

}  // namespace

Result<void*> allocateSharedGpuMemory(size_t bytes) {
  if (bytes == 0) return invalidArgument("allocating 0 bytes of GPU memory");
  std::string why;
  const driver_ipc::Driver* d = driver_ipc::loadDriver(why);
  if (d == nullptr)
    return notSupported(strCat("GPU memory needs the CUDA driver of a process that uses a GPU (",
                               why, "); initialise CUDA first"));
  if (CuResult r = d->init(0); r != kSuccess) return d->error(r, "initialising CUDA");
  driver_ipc::CuDevice device = 0;
  if (driver_ipc::CuDevice current = 0;
      d->ctxGetDevice != nullptr && d->ctxGetDevice(&current) == kSuccess)
    device = current;
  SharedAllocation allocation;
  BRAID_ASSIGN_OR_RETURN(allocation.context, driver_ipc::PrimaryContext::retain(*d, device));
  const driver_ipc::PrimaryContext& context = *allocation.context;
  driver_ipc::DevicePtr pointer = 0;
  BRAID_ASSIGN_OR_RETURN(const bool fds, driver_ipc::exportsDescriptors(*d, context));
  if (fds) {
    auto made = driver_ipc::createFdExportedMemory(*d, context, bytes);
    Result<FdTicket> ticket = made.isOk() ? offer(std::move(made->fd)) : made.status();
    if (ticket.isOk()) {
      pointer = made->pointer;
      allocation.mappedBytes = made->mappedBytes;
      allocation.offer = ticket->id;
      const driver_ipc::FdMemoryHandle contents{*ticket, made->mappedBytes};
      allocation.whole.handle.scheme = IpcHandle::Scheme::kPosixFd;
      std::memcpy(allocation.whole.handle.bytes.data(), &contents, sizeof(contents));
      allocation.whole.peerHoldsMemory = true;
    } else {
      if (made.isOk())
        (void)context.call(
            "", [&] { return driver_ipc::unmapAllocation(*d, made->pointer, made->mappedBytes); });
      // Each live allocation holds a descriptor (the process's limit on
      // open files bounds them): past it, memory not read in place.
      BRAID_WARN("GPU memory exported as a file descriptor failed (", ticket.status().message(),
                 "); cuMemAlloc memory instead, which peers do not read in place");
    }
  }
  if (pointer == 0)
    BRAID_RETURN_IF_ERROR(context.call(strCat("allocating ", bytes, " bytes of GPU memory"),
                                       [&] { return d->memAlloc(&pointer, bytes); }));
  allocation.bytes = allocation.mappedBytes != 0 ? allocation.mappedBytes : bytes;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (allocation.mappedBytes != 0) {
    allocation.whole.allocationId = kSharedAllocationIds | r.nextId++;
    r.liveIds.insert(allocation.whole.allocationId);
  }
  r.allocations[static_cast<uintptr_t>(pointer)] = std::move(allocation);
  return reinterpret_cast<void*>(static_cast<uintptr_t>(pointer));
}

Status freeSharedGpuMemory(void* data) {
  SharedAllocation allocation;
  std::shared_ptr<FdServer> server;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.allocations.find(reinterpret_cast<uintptr_t>(data));
    if (it == r.allocations.end())
      return invalidArgument("a pointer that braidMemAlloc did not return, or freed already");
    allocation = std::move(it->second);
    r.allocations.erase(it);
    server = r.server;
    if (allocation.mappedBytes != 0) {
      r.liveIds.erase(allocation.whole.allocationId);
      r.freed.fetch_add(1, std::memory_order_release);
    }
  }
  // Peers that have not fetched the descriptor yet are refused from now on.
  if (allocation.offer != 0) server->withdraw(allocation.offer);
  const driver_ipc::PrimaryContext& context = *allocation.context;
  // The GPU may still use it: left as it is.
  if (allocation.abandoned || context.wedged()) return Status::ok();
  const driver_ipc::Driver& d = context.driver();
  const auto pointer = driver_ipc::devicePointer(data);
  return context.call("freeing GPU memory", [&] {
    return allocation.mappedBytes != 0
               ? driver_ipc::unmapAllocation(d, pointer, allocation.mappedBytes)
               : d.memFree(pointer);
  });
}

std::optional<ExportedRange> sharedGpuRange(const void* data, size_t bytes) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const auto [a, offset] = allocationHolding(r, data);
  if (a == nullptr || a->mappedBytes == 0 || bytes > a->mappedBytes - offset) return std::nullopt;
  ExportedRange range = a->whole;
  range.offset = offset;
  return range;
}

bool insideSharedGpuMemory(const void* data) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return allocationHolding(r, data).first != nullptr;
}

void abandonSharedGpuMemoryOf(int device) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (auto& [address, allocation] : r.allocations)
    if (allocation.context->device() == device) allocation.abandoned = true;
}

uint64_t sharedGpuMemoryFreedSince(uint64_t seen, const std::set<uint64_t>& named,
                                   std::vector<uint64_t>& freed) {
  Registry& r = registry();
  if (r.freed.load(std::memory_order_acquire) == seen) return seen;  // no lock: the usual case
  std::lock_guard lock(r.mutex);
  for (const uint64_t id : named)
    if (r.liveIds.count(id) == 0) freed.push_back(id);
  return r.freed.load(std::memory_order_relaxed);
}

}  // namespace braid::transport::cuda_ipc
