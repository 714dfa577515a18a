#include "transports/cuda_ipc/driver_api.h"

#include <mutex>

namespace braid::transport::cuda_ipc::driver_ipc {

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
  finder.find(d.streamQuery, "cuStreamQuery");
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
  finder.findOptional(d.threadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
  finder.findOptional(d.memGetAddressRange, "cuMemGetAddressRange_v2");
  finder.findOptional(d.pointerGetAttribute, "cuPointerGetAttribute");
  finder.findOptional(d.ctxGetDevice, "cuCtxGetDevice");
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

}  // namespace braid::transport::cuda_ipc::driver_ipc
