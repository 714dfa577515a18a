#include "src/device_staging.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "braid_config.h"
#include "src/common/cuda_driver.h"
#include "src/common/strcat.h"

namespace braid {
namespace {

using CuResult = cudadriver::Result;
using CuDevicePtr = cudadriver::DevicePtr;
using CuContext = cudadriver::Context;
constexpr CuResult kCudaSuccess = cudadriver::kSuccess;
constexpr int kAttributeContext = 1;        // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int kAttributeDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL

// The entry points used here, from the driver the process loaded.
struct Driver {
  CuResult (*pointerGetAttribute)(void*, int, CuDevicePtr) = nullptr;
  CuResult (*ctxPushCurrent)(CuContext) = nullptr;
  CuResult (*ctxPopCurrent)(CuContext*) = nullptr;
  CuResult (*ctxSynchronize)() = nullptr;
  CuResult (*memcpyDtoH)(void*, CuDevicePtr, size_t) = nullptr;
  CuResult (*memcpyHtoD)(CuDevicePtr, const void*, size_t) = nullptr;
  CuResult (*getErrorString)(CuResult, const char**) = nullptr;
  CuResult (*deviceGet)(int*, int) = nullptr;
  CuResult (*primaryCtxRetain)(CuContext*, int) = nullptr;
  CuResult (*ctxGetCurrent)(CuContext*) = nullptr;
  cudadriver::ExchangeCaptureMode threadExchangeStreamCaptureMode = nullptr;  // optional
  std::string missing;  // why the driver cannot be used; empty when it can
};

// Looked up once, when the first GPU buffer is staged: memory_kind.cc found
// that buffer through a loaded driver, and the handle is never closed, so
// the driver stays for the life of the process.
const Driver& driver() {
  static const Driver loaded = [] {
    Driver d;
    cudadriver::EntryFinder finder;
    auto find = [&](auto& entry, const char* name) { finder.find(entry, name); };
    find(d.pointerGetAttribute, "cuPointerGetAttribute");
    find(d.ctxPushCurrent, "cuCtxPushCurrent_v2");
    find(d.ctxPopCurrent, "cuCtxPopCurrent_v2");
    find(d.ctxSynchronize, "cuCtxSynchronize");
    find(d.memcpyDtoH, "cuMemcpyDtoH_v2");
    find(d.memcpyHtoD, "cuMemcpyHtoD_v2");
    find(d.getErrorString, "cuGetErrorString");
    find(d.deviceGet, "cuDeviceGet");
    find(d.primaryCtxRetain, "cuDevicePrimaryCtxRetain");
    find(d.ctxGetCurrent, "cuCtxGetCurrent");
    finder.findOptional(d.threadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
    d.missing = finder.missing;
    return d;
  }();
  return loaded;
}

}  // namespace

Status cudaDriverError(int result, const std::string& what) {
  const Driver& d = driver();
  const char* text = nullptr;
  if (d.getErrorString == nullptr || d.getErrorString(result, &text) != kCudaSuccess ||
      text == nullptr)
    text = "unknown CUDA error";
  return Status(ErrorCode::kUnhandledCudaError,
                strCat(what, ": ", text, " (CUDA error ", result, ")"));
}

namespace {

CuDevicePtr devicePointer(const void* p) {
  return static_cast<CuDevicePtr>(reinterpret_cast<uintptr_t>(p));
}

// When a copy waits for the context that owns its GPU buffer: before it, so
// that work queued earlier on any stream has written what is read; or after
// it, so that work queued later sees what was written (a copy from pageable
// host memory may return before its DMA has ended).
enum class Wait { kBefore, kAfter };

// The primary context of GPU `ordinal`, retained once for the life of the
// process (as the CUDA runtime does).
Result<CuContext> primaryContext(const Driver& d, int ordinal, const char* what) {
  static std::mutex mutex;
  static std::map<int, CuContext> retained;
  std::lock_guard lock(mutex);
  if (auto it = retained.find(ordinal); it != retained.end()) return it->second;
  int device = 0;
  CuContext context = nullptr;
  if (CuResult r = d.deviceGet(&device, ordinal); r != kCudaSuccess)
    return cudaDriverError(r, strCat(what, ": GPU ", ordinal));
  if (CuResult r = d.primaryCtxRetain(&context, device); r != kCudaSuccess)
    return cudaDriverError(r, strCat(what, ": the primary context of GPU ", ordinal));
  retained[ordinal] = context;
  return context;
}

// The context that owns `gpu`. Memory of the virtual memory API (cuMemCreate,
// as PyTorch's expandable segments allocate) and of memory pools
// (cudaMallocAsync) belongs to none: the driver says NULL, and the primary
// context of its GPU, the one the runtime uses, reaches it. Managed memory
// of a pool may name no GPU either (the driver says -1, the CPU): any
// context reaches it, so the calling thread's current one does.
Result<CuContext> contextOf(const Driver& d, const void* gpu, const char* what) {
  CuContext context = nullptr;
  if (CuResult r = d.pointerGetAttribute(&context, kAttributeContext, devicePointer(gpu));
      r != kCudaSuccess)
    return cudaDriverError(r, strCat(what, ": the buffer's context"));
  if (context != nullptr) return context;
  int ordinal = -1;
  if (CuResult r = d.pointerGetAttribute(&ordinal, kAttributeDeviceOrdinal, devicePointer(gpu));
      r != kCudaSuccess)
    return cudaDriverError(r, strCat(what, ": the buffer's GPU"));
  if (ordinal >= 0) return primaryContext(d, ordinal, what);
  if (CuResult r = d.ctxGetCurrent(&context); r != kCudaSuccess)
    return cudaDriverError(r, strCat(what, ": the current context"));
  if (context == nullptr)
    return invalidArgument(
        strCat(what,
               ": the buffer belongs to no CUDA context and names no GPU (managed memory of "
               "a memory pool); make a GPU current on this thread (cudaSetDevice)"));
  return context;
}

// Runs `work` with the context that owns `gpu` current on this thread.
template <typename Work>
Status inContextOf(const void* gpu, const char* what, Wait wait, Work&& work) {
  const Driver& d = driver();
  if (!d.missing.empty()) return notSupported(strCat(what, ": ", d.missing));
  const cudadriver::RelaxedCapture relaxed(d.threadExchangeStreamCaptureMode);
  BRAID_ASSIGN_OR_RETURN(CuContext context, contextOf(d, gpu, what));
  if (CuResult r = d.ctxPushCurrent(context); r != kCudaSuccess)
    return cudaDriverError(r, strCat(what, ": entering the buffer's context"));
  Status status = Status::ok();
  if (wait == Wait::kBefore)
    if (CuResult r = d.ctxSynchronize(); r != kCudaSuccess)
      status = cudaDriverError(r, strCat(what, ": waiting for the GPU"));
  if (status.isOk())
    if (CuResult r = work(d); r != kCudaSuccess) status = cudaDriverError(r, what);
  if (status.isOk() && wait == Wait::kAfter)
    if (CuResult r = d.ctxSynchronize(); r != kCudaSuccess)
      status = cudaDriverError(r, strCat(what, ": waiting for the copy"));
  CuContext popped = nullptr;
  (void)d.ctxPopCurrent(&popped);
  return status;
}

class ContextOrderedCopies final : public GpuCopies {
 public:
  Status toHost(void* host, const void* gpu, size_t bytes, const char* what) override {
    return inContextOf(gpu, what, Wait::kBefore, [&](const Driver& d) {
      return d.memcpyDtoH(host, devicePointer(gpu), bytes);
    });
  }
  Status toGpu(void* gpu, const void* host, size_t bytes, const char* what) override {
    return inContextOf(gpu, what, Wait::kAfter, [&](const Driver& d) {
      return d.memcpyHtoD(devicePointer(gpu), host, bytes);
    });
  }
  Status awaitEarlierWork(const void* gpu, const char* what) override {
    return waitForGpuWork(gpu, what);
  }
};

bool encloses(const void* outer, size_t outerBytes, const void* inner, size_t innerBytes) {
  auto o = reinterpret_cast<uintptr_t>(outer), i = reinterpret_cast<uintptr_t>(inner);
  return outer != nullptr && inner != nullptr && o <= i && i + innerBytes <= o + outerBytes;
}

}  // namespace

Status waitForGpuWork(const void* gpu, const char* what) {
  return inContextOf(gpu, what, Wait::kBefore, [](const Driver&) { return kCudaSuccess; });
}

GpuCopies& contextOrderedCopies() {
  static ContextOrderedCopies copies;
  return copies;
}

bool gpuStagingBuilt() {
#ifdef BRAID_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Result<StagedBuffers> StagedBuffers::stage(const void* send, size_t sendBytes, bool sendOnGpu,
                                           void* recv, size_t recvBytes, bool recvOnGpu,
                                           GpuCopies& copies) {
  StagedBuffers s;
  s.copies_ = &copies;
  s.send_ = send;
  s.recv_ = recv;
  // In place: one allocation, so one kind; the enclosing buffer goes over.
  if (send != nullptr && recv != nullptr && (sendOnGpu || recvOnGpu)) {
    if (encloses(recv, recvBytes, send, sendBytes)) {
      s.recvCopy_.resize(recvBytes);
      BRAID_RETURN_IF_ERROR(copies.toHost(s.recvCopy_.data(), recv, recvBytes, "staging recvbuff"));
      s.gpuRecv_ = recv;
      s.recv_ = s.recvCopy_.data();
      s.send_ = s.recvCopy_.data() + (static_cast<const std::byte*>(send) -
                                      static_cast<const std::byte*>(static_cast<void*>(recv)));
      return s;
    }
    if (encloses(send, sendBytes, recv, recvBytes)) {
      // recv inside send (ReduceScatter, Scatter in place): the result is
      // the part of the enclosing buffer recv covers.
      s.recvCopy_.resize(sendBytes);
      BRAID_RETURN_IF_ERROR(copies.toHost(s.recvCopy_.data(), send, sendBytes, "staging sendbuff"));
      s.gpuRecv_ = const_cast<void*>(send);
      s.send_ = s.recvCopy_.data();
      s.recv_ = s.recvCopy_.data() +
                (static_cast<std::byte*>(recv) - static_cast<const std::byte*>(send));
      return s;
    }
  }
  if (sendOnGpu && send != nullptr && sendBytes > 0) {
    s.sendCopy_.resize(sendBytes);
    BRAID_RETURN_IF_ERROR(copies.toHost(s.sendCopy_.data(), send, sendBytes, "staging sendbuff"));
    s.send_ = s.sendCopy_.data();
  }
  if (recvOnGpu && recv != nullptr && recvBytes > 0) {
    s.recvCopy_.resize(recvBytes);
    BRAID_RETURN_IF_ERROR(copies.toHost(s.recvCopy_.data(), recv, recvBytes, "staging recvbuff"));
    s.gpuRecv_ = recv;
    s.recv_ = s.recvCopy_.data();
  }
  return s;
}

Status StagedBuffers::finish() {
  if (gpuRecv_ == nullptr) return Status::ok();
  return copies_->toGpu(gpuRecv_, recvCopy_.data(), recvCopy_.size(),
                        "copying the result to the GPU");
}

}  // namespace braid
