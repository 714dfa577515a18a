#include "cuda_buffers.h"

#include <dlfcn.h>

#include <stdexcept>
#include <string>

#include "braid.h"

namespace braid::perf {

// The driver API's entry points used here, with the ABI's types spelled as
// plain integers (cuda.h is not needed to build this).
struct CudaDriver::Api {
  using Device = int;
  using DevicePtr = unsigned long long;
  int (*init)(unsigned);
  int (*deviceGetCount)(int*);
  int (*deviceGet)(Device*, int);
  int (*primaryCtxRetain)(void**, Device);
  int (*primaryCtxRelease)(Device);
  int (*ctxSetCurrent)(void*);
  int (*memAlloc)(DevicePtr*, size_t);
  int (*memFree)(DevicePtr);
  int (*memcpyHtoD)(DevicePtr, const void*, size_t);
  int (*memcpyDtoH)(void*, DevicePtr, size_t);
  int (*getErrorString)(int, const char**);
};

namespace {

template <typename F>
void resolve(void* library, const char* name, F*& entry) {
  entry = reinterpret_cast<F*>(dlsym(library, name));
  if (entry == nullptr)
    throw std::runtime_error(std::string("--mem cuda: the CUDA driver has no ") + name);
}

}  // namespace

CudaDriver::CudaDriver(int rank) : api_(std::make_unique<Api>()) {
  // Global, as a CUDA program loads it: braid then finds the driver loaded
  // and asks it where each buffer lives (src/memory_kind.h).
  library_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (library_ == nullptr)
    throw std::runtime_error(
        std::string("--mem cuda: the CUDA driver (libcuda.so.1) could not be loaded: ") +
        dlerror());
  Api& a = *api_;
  resolve(library_, "cuGetErrorString", a.getErrorString);
  resolve(library_, "cuInit", a.init);
  resolve(library_, "cuDeviceGetCount", a.deviceGetCount);
  resolve(library_, "cuDeviceGet", a.deviceGet);
  resolve(library_, "cuDevicePrimaryCtxRetain", a.primaryCtxRetain);
  resolve(library_, "cuDevicePrimaryCtxRelease_v2", a.primaryCtxRelease);
  resolve(library_, "cuCtxSetCurrent", a.ctxSetCurrent);
  resolve(library_, "cuMemAlloc_v2", a.memAlloc);
  resolve(library_, "cuMemFree_v2", a.memFree);
  resolve(library_, "cuMemcpyHtoD_v2", a.memcpyHtoD);
  resolve(library_, "cuMemcpyDtoH_v2", a.memcpyDtoH);
  check(a.init(0), "cuInit");
  int count = 0;
  check(a.deviceGetCount(&count), "cuDeviceGetCount");
  if (count < 1) throw std::runtime_error("--mem cuda: the CUDA driver sees no GPU");
  ordinal_ = rank % count;
  check(a.deviceGet(&device_, ordinal_), "cuDeviceGet");
  check(a.primaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
  check(a.ctxSetCurrent(context_), "cuCtxSetCurrent");
}

CudaDriver::~CudaDriver() {
  if (context_ != nullptr) {
    (void)api_->ctxSetCurrent(nullptr);
    (void)api_->primaryCtxRelease(device_);
  }
  // The driver stays loaded: unloading it under a live process is what CUDA
  // programs never do, and braid may still hold its entry points.
}

void CudaDriver::check(int result, const char* call) {
  if (result == 0) return;
  const char* text = nullptr;
  if (api_->getErrorString == nullptr || api_->getErrorString(result, &text) != 0 ||
      text == nullptr)
    text = "unknown error";
  throw std::runtime_error(std::string("--mem cuda: ") + call + " failed: " + text +
                           " (CUDA error " + std::to_string(result) + ")");
}

CudaDriver::Buffer CudaDriver::allocate(size_t bytes, bool shared) {
  if (shared) {
    void* memory = nullptr;
    if (braidMemAlloc(&memory, bytes == 0 ? 1 : bytes) != braidSuccess)
      throw std::runtime_error(std::string("--mem cuda -R 1: ") + braidGetLastError(nullptr));
    return Buffer(static_cast<std::byte*>(memory), Free{this, true});
  }
  Api::DevicePtr memory = 0;
  check(api_->memAlloc(&memory, bytes == 0 ? 1 : bytes), "cuMemAlloc");
  return Buffer(reinterpret_cast<std::byte*>(memory), Free{this, false});
}

void CudaDriver::Free::operator()(std::byte* memory) const {
  if (braidMemory)
    (void)braidMemFree(memory);
  else
    (void)driver->api_->memFree(reinterpret_cast<Api::DevicePtr>(memory));
}

void CudaDriver::toDevice(std::byte* device, const std::byte* host, size_t bytes) {
  if (bytes == 0) return;
  check(api_->memcpyHtoD(reinterpret_cast<Api::DevicePtr>(device), host, bytes), "cuMemcpyHtoD");
}

void CudaDriver::toHost(std::byte* host, const std::byte* device, size_t bytes) {
  if (bytes == 0) return;
  check(api_->memcpyDtoH(host, reinterpret_cast<Api::DevicePtr>(device), bytes), "cuMemcpyDtoH");
}

}  // namespace braid::perf
