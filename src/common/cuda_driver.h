// The CUDA driver (libcuda.so.1) that the process has loaded, for the parts
// of braid that use it at run time (staging, CUDA streams). braid never
// loads the driver itself (see memory_kind.h), so a CPU-only job never
// creates a CUDA context because of it; and no CUDA header is needed to
// build these parts.
#pragma once

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "src/common/strcat.h"

namespace braid::cudadriver {

// The driver API's types and values (cuda.h), declared rather than included.
using Result = int;                    // CUresult
using DevicePtr = unsigned long long;  // CUdeviceptr
using Context = void*;                 // CUcontext
using Stream = void*;                  // CUstream
constexpr Result kSuccess = 0;
constexpr Result kNotReady = 600;  // CUDA_ERROR_NOT_READY

// While another thread of the process captures a CUDA graph in the default
// mode (CU_STREAM_CAPTURE_MODE_GLOBAL, as torch.cuda.graph does), the driver
// refuses "potentially unsafe" calls (allocations, synchronizations,
// queries) on every other thread whose own mode is global too, and that
// capture fails. braid's calls are never part of a capture: those that
// allocate, copy, synchronize or query run with the thread's mode relaxed,
// then restore it, as NCCL does. `exchange`
// (cuThreadExchangeStreamCaptureMode) may be null: drivers before CUDA 10.1
// have no captures.
using ExchangeCaptureMode = Result (*)(int*);
class RelaxedCapture {
 public:
  explicit RelaxedCapture(ExchangeCaptureMode exchange) : exchange_(exchange) {
    if (exchange_ != nullptr && exchange_(&mode_) != kSuccess) exchange_ = nullptr;
  }
  ~RelaxedCapture() {
    if (exchange_ != nullptr) (void)exchange_(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  static constexpr int kRelaxed = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED
  ExchangeCaptureMode exchange_;
  int mode_ = kRelaxed;  // the thread's own while relaxed
};

// Looks up the driver's entry points: `find(entry, name)` for each, after
// which `missing` says why the driver cannot be used (empty when it can).
class EntryFinder {
 public:
  EntryFinder() : handle_(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) {
    if (handle_ == nullptr) missing = "the CUDA driver (libcuda.so.1) is not loaded";
  }
  template <typename F>
  void find(F& entry, const char* name) {
    entry = handle_ ? reinterpret_cast<std::remove_reference_t<F>>(dlsym(handle_, name)) : nullptr;
    if (entry == nullptr && missing.empty()) missing = strCat("the CUDA driver has no ", name);
  }
  // The same for an entry that older drivers lack: null then, and not
  // counted as missing.
  template <typename F>
  void findOptional(F& entry, const char* name) {
    entry = handle_ ? reinterpret_cast<std::remove_reference_t<F>>(dlsym(handle_, name)) : nullptr;
  }
  std::string missing;

 private:
  // Never closed: the driver stays for the life of the process.
  void* handle_;
};

}  // namespace braid::cudadriver
