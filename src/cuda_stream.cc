#include "src/cuda_stream.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "src/common/cuda_driver.h"
#include "src/common/poll_until.h"
#include "src/common/strcat.h"
#include "src/gpu_path.h"

namespace braid {
namespace {

using cudadriver::DevicePtr;
using CuResult = cudadriver::Result;
using cudadriver::kSuccess;

constexpr unsigned kStreamNonBlocking = 0x1;   // CU_STREAM_NON_BLOCKING
constexpr unsigned kHostAllocPortable = 0x1;   // CU_MEMHOSTALLOC_PORTABLE
constexpr unsigned kHostAllocDeviceMap = 0x2;  // CU_MEMHOSTALLOC_DEVICEMAP
// Not CU_STREAM_WAIT_VALUE_EQ (0x1): after a failure the calls queued behind
// it release at once, so the word may pass a wait's value before the stream
// reaches that wait, which must then still pass.
constexpr unsigned kWaitValueGreaterEqual = 0x0;  // CU_STREAM_WAIT_VALUE_GEQ
// The per-thread default stream (cudaStreamPerThread) is the calling
// thread's: from braid's thread the same handle names another stream.
void* const kPerThreadStream = reinterpret_cast<void*>(0x2);  // CU_STREAM_PER_THREAD
void* const kLegacyStream = reinterpret_cast<void*>(0x1);     // CU_STREAM_LEGACY
constexpr int kCaptureStatusNone = 0;                         // CU_STREAM_CAPTURE_STATUS_NONE

struct StreamDriver {
  CuResult (*streamGetCtx)(void*, void**) = nullptr;
  CuResult (*streamCreate)(void**, unsigned) = nullptr;
  CuResult (*streamDestroy)(void*) = nullptr;
  CuResult (*streamSynchronize)(void*) = nullptr;
  CuResult (*streamQuery)(void*) = nullptr;
  CuResult (*streamIsCapturing)(void*, int*) = nullptr;
  CuResult (*launchHostFunc)(void*, void (*)(void*), void*) = nullptr;
  CuResult (*streamWaitValue32)(void*, DevicePtr, uint32_t, unsigned) = nullptr;
  CuResult (*memHostAlloc)(void**, size_t, unsigned) = nullptr;
  CuResult (*memHostGetDevicePointer)(DevicePtr*, void*, unsigned) = nullptr;
  CuResult (*memFreeHost)(void*) = nullptr;
  CuResult (*memcpyDtoHAsync)(void*, DevicePtr, size_t, void*) = nullptr;
  CuResult (*memcpyHtoDAsync)(DevicePtr, const void*, size_t, void*) = nullptr;
  CuResult (*ctxPushCurrent)(void*) = nullptr;
  CuResult (*ctxPopCurrent)(void**) = nullptr;
  cudadriver::ExchangeCaptureMode threadExchangeStreamCaptureMode = nullptr;  // optional
  std::string missing;
};

const StreamDriver& driver() {
  static const StreamDriver loaded = [] {
    StreamDriver d;
    cudadriver::EntryFinder finder;
    finder.find(d.streamGetCtx, "cuStreamGetCtx");
    finder.find(d.streamCreate, "cuStreamCreate");
    finder.find(d.streamDestroy, "cuStreamDestroy_v2");
    finder.find(d.streamSynchronize, "cuStreamSynchronize");
    finder.find(d.streamQuery, "cuStreamQuery");
    finder.find(d.streamIsCapturing, "cuStreamIsCapturing");
    finder.find(d.launchHostFunc, "cuLaunchHostFunc");
    // CUDA 11.7 named the stream memory operations that every CUDA 12
    // device supports *_v2; the first names remain for older drivers.
    cudadriver::EntryFinder optional;
    optional.find(d.streamWaitValue32, "cuStreamWaitValue32_v2");
    if (d.streamWaitValue32 == nullptr) finder.find(d.streamWaitValue32, "cuStreamWaitValue32");
    finder.find(d.memHostAlloc, "cuMemHostAlloc");
    finder.find(d.memHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
    finder.find(d.memFreeHost, "cuMemFreeHost");
    finder.find(d.memcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    finder.find(d.memcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    finder.find(d.ctxPushCurrent, "cuCtxPushCurrent_v2");
    finder.find(d.ctxPopCurrent, "cuCtxPopCurrent_v2");
    finder.findOptional(d.threadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
    d.missing = finder.missing;
    return d;
  }();
  return loaded;
}

// The pinned memory each bridge stages through: two halves, one filled by
// a DMA while the other is copied by the CPU.
constexpr size_t kBounceBytes = size_t{4} << 20;
constexpr size_t kBounceHalf = kBounceBytes / 2;

// Bounce buffers of bridges gone, for the next: pinned memory is never
// freed, since freeing it waits for the whole GPU, which a CUDA stream
// waiting for a call of another bridge may hold. Portable: any context.
std::mutex spareBouncesMutex;
std::vector<void*> spareBounces;

DevicePtr devicePointer(const void* p) {
  return static_cast<DevicePtr>(reinterpret_cast<uintptr_t>(p));
}

// Runs on the CUDA stream's host-function thread: no CUDA call allowed.
// `data` is a shared_ptr of its own, so the signal outlives a task that
// stopped waiting for it.
void markReached(void* data) {
  std::unique_ptr<std::shared_ptr<CudaStreamBridge::Gate::Reached>> owner(
      static_cast<std::shared_ptr<CudaStreamBridge::Gate::Reached>*>(data));
  CudaStreamBridge::Gate::Reached& reached = **owner;
  {
    std::lock_guard lock(reached.mutex);
    reached.reached = true;
  }
  reached.changed.notify_all();
}

}  // namespace

Result<std::shared_ptr<CudaStreamBridge>> CudaStreamBridge::create(void* cudaStream) {
  const StreamDriver& d = driver();
  if (!d.missing.empty()) return notSupported(d.missing);
  if (cudaStream == kPerThreadStream)
    return invalidArgument(
        "cudaStreamPerThread names a different stream on each thread, and braid waits for the "
        "stream on a thread of its own: pass a stream made by cudaStreamCreate, or the legacy "
        "default stream (0)");
  std::shared_ptr<CudaStreamBridge> bridge(new CudaStreamBridge);
  bridge->stream_ = cudaStream;
  // The driver reads it once, when it makes the context; so does braid.
  if (const char* connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS"))
    bridge->oneWorkQueue_ = std::strtol(connections, nullptr, 10) == 1;
  // The legacy default stream (0 or cudaStreamLegacy) is that of the
  // context current on the calling thread; braid then enters that context
  // wherever it names the stream.
  if (CuResult r = d.streamGetCtx(cudaStream, &bridge->context_); r != kSuccess)
    return cudaDriverError(r, cudaStream == nullptr || cudaStream == kLegacyStream
                                  ? "the default stream's context (none is current on this "
                                    "thread: call cudaSetDevice first)"
                                  : "the CUDA stream's context");
  BRAID_RETURN_IF_ERROR(bridge->inContext("making braid's copy stream", [&] {
    return d.streamCreate(&bridge->copyStream_, kStreamNonBlocking);
  }));
  // Before the stream ever waits for a call (src/gpu_path.h).
  (void)bridge->inContext("loading braid's kernels", [] {
    loadGpuKernels();
    return kSuccess;
  });
  void* word = nullptr;
  BRAID_RETURN_IF_ERROR(bridge->inContext("allocating the stream's release word", [&] {
    return d.memHostAlloc(&word, sizeof(uint32_t), kHostAllocPortable | kHostAllocDeviceMap);
  }));
  bridge->released_ = static_cast<uint32_t*>(word);
  *bridge->released_ = 0;
  BRAID_RETURN_IF_ERROR(bridge->inContext("mapping the stream's release word", [&] {
    return d.memHostGetDevicePointer(&bridge->releasedOnGpu_, word, 0);
  }));
  return bridge;
}

CudaStreamBridge::~CudaStreamBridge() {
  const StreamDriver& d = driver();
  // The copy stream waits for nothing but braid's own copies, which end;
  // the next bridge may reuse the pinned memory they read or write. Not
  // those of copies that did not end in time.
  if (copyStream_ != nullptr && !stuck_)
    (void)inContext("", [&] {
      (void)d.streamSynchronize(copyStream_);
      return d.streamDestroy(copyStream_);
    });
  if (bounce_ != nullptr && !stuck_) {
    std::lock_guard lock(spareBouncesMutex);
    spareBounces.push_back(bounce_);
  }
  // The CUDA stream reads the word in its waits, which it may not have run
  // yet (held by work queued before a call that gave up waiting for it):
  // freed only once the stream has run everything; else its 4 bytes stay.
  if (released_ != nullptr && inContext("", [&] { return d.streamQuery(stream_); }).isOk())
    (void)inContext("", [&] { return d.memFreeHost(released_); });
}

Status CudaStreamBridge::inContext(const char* what, const std::function<int()>& work) {
  const StreamDriver& d = driver();
  const cudadriver::RelaxedCapture relaxed(d.threadExchangeStreamCaptureMode);
  if (CuResult r = d.ctxPushCurrent(context_); r != kSuccess)
    return cudaDriverError(r, strCat(what, ": entering the CUDA stream's context"));
  const CuResult r = work();
  void* popped = nullptr;
  (void)d.ctxPopCurrent(&popped);
  return r == kSuccess ? Status::ok() : cudaDriverError(r, what);
}

Status CudaStreamBridge::prepareStaging() {
  if (bounce_ != nullptr) return Status::ok();
  {
    std::lock_guard lock(spareBouncesMutex);
    if (!spareBounces.empty()) {
      bounce_ = spareBounces.back();
      spareBounces.pop_back();
      return Status::ok();
    }
  }
  const StreamDriver& d = driver();
  return inContext("allocating the stream's pinned staging memory",
                   [&] { return d.memHostAlloc(&bounce_, kBounceBytes, kHostAllocPortable); });
}

Status CudaStreamBridge::refuseIfCapturing() {
  // A stream that captures a graph records the host function and the wait
  // rather than running them: the call would never learn that the stream
  // got there, and each replay would pass the wait without it.
  const StreamDriver& d = driver();
  int capture = kCaptureStatusNone;
  BRAID_RETURN_IF_ERROR(inContext("asking whether the CUDA stream captures a graph",
                                  [&] { return d.streamIsCapturing(stream_, &capture); }));
  if (capture != kCaptureStatusNone)
    return notSupported(
        "the CUDA stream is capturing a CUDA graph (cudaStreamBeginCapture): a braid call runs "
        "on braid's threads, which a graph cannot hold, so a replay would skip it; make the "
        "call outside the capture");
  return Status::ok();
}

Status CudaStreamBridge::gpuBuffersAllowed() const {
  if (!oneWorkQueue_) return Status::ok();
  return notSupported(
      "GPU buffers on a CUDA stream with CUDA_DEVICE_MAX_CONNECTIONS=1: every CUDA stream of the "
      "process then shares one hardware queue, in which the CUDA stream's wait for the call "
      "would hold braid's own GPU copies queued behind it for good. Set it above 1 (the "
      "driver's default is 8), or pass the buffers on a stream of braidStreamCreate after "
      "synchronizing the CUDA stream");
}

namespace {
// Gates held and not released, process-wide; taken exclusively to count
// one more, so that work under ifNoGateHeld ends before any stream waits.
std::shared_mutex gatesMutex;
int gatesHeld = 0;
}  // namespace

bool CudaStreamBridge::ifNoGateHeld(const std::function<void()>& work) {
  std::shared_lock lock(gatesMutex);
  if (gatesHeld > 0) return false;
  work();
  return true;
}

Result<CudaStreamBridge::Gate> CudaStreamBridge::hold() {
  const StreamDriver& d = driver();
  std::lock_guard lock(holdMutex_);
  BRAID_RETURN_IF_ERROR(refuseIfCapturing());
  Gate gate;
  gate.reached = std::make_shared<Gate::Reached>();
  gate.release = held_ + 1;
  // Counted before the stream can wait for it (and uncounted if it cannot).
  {
    std::unique_lock counting(gatesMutex);
    ++gatesHeld;
  }
  struct Uncount {
    bool armed = true;
    ~Uncount() {
      if (!armed) return;
      std::unique_lock counting(gatesMutex);
      --gatesHeld;
    }
  } uncount;
  // The host function owns a reference; on a stream that faults before it,
  // it never runs and that small object is lost.
  auto signal = std::make_unique<std::shared_ptr<Gate::Reached>>(gate.reached);
  BRAID_RETURN_IF_ERROR(inContext("queueing the call on the CUDA stream", [&] {
    return d.launchHostFunc(stream_, markReached, signal.get());
  }));
  signal.release();
  // If this fails, the signal stays queued alone, which holds nothing.
  // Releasing this value instead would let the waits of earlier calls still
  // running pass.
  BRAID_RETURN_IF_ERROR(
      inContext("making the CUDA stream wait for the call (cuStreamWaitValue32)", [&] {
        return d.streamWaitValue32(stream_, releasedOnGpu_, gate.release, kWaitValueGreaterEqual);
      }));
  held_ = gate.release;
  uncount.armed = false;
  return gate;
}

Status CudaStreamBridge::awaitReached(const Gate& gate, double timeoutSeconds,
                                      const std::atomic<bool>& aborted) {
  const StreamDriver& d = driver();
  copyTimeoutSeconds_ = timeoutSeconds;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeoutSeconds));
  std::unique_lock lock(gate.reached->mutex);
  while (!gate.reached->reached) {
    // A faulted kernel stops the stream for good, and its host functions
    // never run: the stream's sticky error says so.
    lock.unlock();
    // In the stream's context: the legacy default stream is the current
    // context's, and this thread is braid's.
    const Status queried = inContext("the CUDA stream failed before the call", [&] {
      const CuResult r = d.streamQuery(stream_);
      return r == cudadriver::kNotReady ? kSuccess : r;
    });
    lock.lock();
    if (gate.reached->reached) break;
    if (!queried.isOk()) return queried;
    // The call fails; its gate is let go, which the stream passes whenever
    // it gets there.
    if (aborted.load(std::memory_order_relaxed))
      return invalidUsage("communicator aborted while the call waited for its CUDA stream");
    if (std::chrono::steady_clock::now() >= deadline)
      return Status(ErrorCode::kTimeout,
                    strCat("the CUDA stream did not reach the call in ", timeoutSeconds,
                           " s (BRAID_TIMEOUT): the work queued before it is still running"));
    gate.reached->changed.wait_for(lock, std::chrono::milliseconds(10));
  }
  return Status::ok();
}

void CudaStreamBridge::release(const Gate& gate) {
  {
    std::unique_lock counting(gatesMutex);
    --gatesHeld;
  }
  // Never backwards: a wait the stream has not reached yet would see a value
  // below its own after it had passed, and hold the stream.
  uint32_t seen = __atomic_load_n(released_, __ATOMIC_ACQUIRE);
  while (static_cast<int32_t>(gate.release - seen) > 0 &&
         !__atomic_compare_exchange_n(released_, &seen, gate.release, false, __ATOMIC_RELEASE,
                                      __ATOMIC_ACQUIRE)) {
  }
}

Status CudaStreamBridge::toHost(void* host, const void* gpu, size_t bytes, const char* what) {
  if (bytes == 0) return Status::ok();
  if (bounce_ == nullptr)
    return internalError(strCat(what, ": the stream's staging memory was not prepared"));
  const StreamDriver& d = driver();
  auto* to = static_cast<uint8_t*>(host);
  const auto* from = static_cast<const uint8_t*>(gpu);
  auto length = [&](size_t offset) { return std::min(kBounceHalf, bytes - offset); };
  // Piece k+1's DMA runs while piece k is copied out of the other half.
  Status status = inContext(what, [&] {
    return d.memcpyDtoHAsync(half(0), devicePointer(from), length(0), copyStream_);
  });
  for (size_t piece = 0, offset = 0; status.isOk() && offset < bytes;
       ++piece, offset += kBounceHalf) {
    const size_t next = offset + kBounceHalf;
    status = awaitCopies(what);
    if (status.isOk() && next < bytes)
      status = inContext(what, [&] {
        return d.memcpyDtoHAsync(half(piece + 1), devicePointer(from + next), length(next),
                                 copyStream_);
      });
    if (status.isOk()) std::memcpy(to + offset, half(piece), length(offset));
  }
  return finishCopies(status);
}

Status CudaStreamBridge::toGpu(void* gpu, const void* host, size_t bytes, const char* what) {
  if (bytes == 0) return Status::ok();
  if (bounce_ == nullptr)
    return internalError(strCat(what, ": the stream's staging memory was not prepared"));
  const StreamDriver& d = driver();
  auto* to = static_cast<uint8_t*>(gpu);
  const auto* from = static_cast<const uint8_t*>(host);
  auto length = [&](size_t offset) { return std::min(kBounceHalf, bytes - offset); };
  // Piece k is copied into its half while piece k-1's DMA runs from the
  // other; the half was last read by piece k-2's, waited for before k-1's.
  Status status = Status::ok();
  for (size_t piece = 0, offset = 0; status.isOk() && offset < bytes;
       ++piece, offset += kBounceHalf) {
    std::memcpy(half(piece), from + offset, length(offset));
    status = awaitCopies(what);
    if (status.isOk())
      status = inContext(what, [&] {
        return d.memcpyHtoDAsync(devicePointer(to + offset), half(piece), length(offset),
                                 copyStream_);
      });
  }
  if (status.isOk()) status = awaitCopies(what);
  return finishCopies(status);
}

Status CudaStreamBridge::finishCopies(Status status) {
  // After a failure a copy may still be queued: it ends before the next
  // call (or bridge) writes the halves it reads or writes.
  if (!status.isOk() && !stuck_) (void)awaitCopies("");
  return status;
}

Status CudaStreamBridge::awaitCopies(const char* what) {
  if (stuck_)
    return Status(ErrorCode::kTimeout,
                  strCat(what, ": an earlier staging copy of this stream never finished"));
  const StreamDriver& d = driver();
  auto copiesRan = [&]() -> Result<bool> {
    bool ran = false;
    BRAID_RETURN_IF_ERROR(inContext(what, [&] {
      const CuResult r = d.streamQuery(copyStream_);
      ran = r == kSuccess;
      return r == cudadriver::kNotReady ? kSuccess : r;
    }));
    return ran;
  };
  BRAID_ASSIGN_OR_RETURN(const bool done, pollUntil(copiesRan, copyTimeoutSeconds_));
  if (done) return Status::ok();
  stuck_ = true;
  return Status(ErrorCode::kTimeout,
                strCat(what, ": braid's staging copies did not finish in ", copyTimeoutSeconds_,
                       " s (BRAID_TIMEOUT); their pinned memory is no longer reused"));
}

uint8_t* CudaStreamBridge::half(size_t piece) const {
  return static_cast<uint8_t*>(bounce_) + piece % 2 * kBounceHalf;
}

}  // namespace braid
