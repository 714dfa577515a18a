// A braid stream ordered on a CUDA stream (braidStreamCreateFromCuda).
//
// braid's transports are driven by host threads, so a call on a CUDA stream
// is bridged: at enqueue, the CUDA stream is given a host function that says
// "the work before this point is done" and then a wait for a 32-bit value in
// pinned host memory (cuStreamWaitValue32), and the call goes to the braid
// stream's thread. That thread waits for the host function, runs the call
// (GPU buffers staged through host memory on a copy stream of braid's own),
// and writes the value, which lets the CUDA stream go on: work queued after
// the call sees its result. The calling thread never waits. No kernel spins
// on the GPU, so processes sharing one GPU without MPS never wait on each
// other's kernels. The value is written after a failure too, so the CUDA
// stream never hangs; the error comes back from braidStreamSynchronize and
// braidCommGetAsyncError.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "src/common/status.h"
#include "src/device_staging.h"

namespace braid {

class CudaStreamBridge final : public GpuCopies {
 public:
  // `cudaStream` is a CUstream / cudaStream_t of the process's loaded driver.
  static Result<std::shared_ptr<CudaStreamBridge>> create(void* cudaStream);
  ~CudaStreamBridge() override;

  // One call's hold on the CUDA stream.
  struct Gate {
    struct Reached {
      std::mutex mutex;
      std::condition_variable changed;
      bool reached = false;
    };
    std::shared_ptr<Reached> reached;
    uint32_t release = 0;  // the value that lets the CUDA stream pass
  };

  // Whether a call with GPU buffers may be ordered on this CUDA stream. Not
  // where all streams share one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS
  // =1): braid's GPU work for the call, queued after the stream's wait for
  // it, would wait behind that wait for ever.
  Status gpuBuffersAllowed() const;
  // Queues on the CUDA stream the signal that its earlier work is done, then
  // the wait for this call. Returns at once. Refused on a stream that is
  // capturing a graph.
  Result<Gate> hold();
  // braidNotSupported where the CUDA stream is capturing a graph (hold()
  // asks too): callers ask first before they make anything for the call.
  Status refuseIfCapturing();
  // Takes the pinned memory staging copies go through (below), if this
  // bridge has none yet: before hold(), for a call it will stage.
  Status prepareStaging();
  // Waits (on braid's stream thread) until the CUDA stream reaches `gate`;
  // fails if the CUDA stream reports an error, once `aborted` (the
  // communicator's flag) is set, or after `timeoutSeconds`.
  Status awaitReached(const Gate& gate, double timeoutSeconds, const std::atomic<bool>& aborted);
  // Lets the CUDA stream pass `gate`. Gates are released in the order held.
  void release(const Gate& gate);
  // Releases a gate when it goes, however its call ends: one that throws
  // (an allocation that fails) must not leave the CUDA stream waiting.
  class ReleaseAtExit {
   public:
    ReleaseAtExit(CudaStreamBridge& bridge, const Gate& gate) : bridge_(bridge), gate_(gate) {}
    ~ReleaseAtExit() { bridge_.release(gate_); }
    ReleaseAtExit(const ReleaseAtExit&) = delete;
    ReleaseAtExit& operator=(const ReleaseAtExit&) = delete;

   private:
    CudaStreamBridge& bridge_;
    const Gate& gate_;
  };
  // Held from before a call takes its gate until its task is queued on the
  // braid stream: the stream's thread awaits gates in the order of its
  // tasks, so two threads calling on one braid stream must not queue their
  // tasks in the other order than they took their gates. prepareStaging()
  // is made under it too.
  std::mutex& orderMutex() { return orderMutex_; }
  // Runs `work` and returns true if no gate of any bridge of the process is
  // held, none being taken meanwhile; else false: some CUDA stream may wait
  // for a call, and nothing may take the driver's memory lock (below).
  static bool ifNoGateHeld(const std::function<void()>& work);

  // Staging copies on braid's own copy stream, which waits for nothing but
  // itself: a copy that waited for the whole context would wait for the
  // held CUDA stream, which waits for this call. They go through pinned
  // memory taken by prepareStaging(), in pieces, one piece's DMA
  // beside the other's memcpy: a copy to or from pageable memory, like an
  // allocation, takes the driver's memory lock, which an application thread
  // may hold while it waits for the held stream (a copy to pageable memory
  // queued after the call), so none is made while a stream waits.
  Status toHost(void* host, const void* gpu, size_t bytes, const char* what) override;
  Status toGpu(void* gpu, const void* host, size_t bytes, const char* what) override;
  // Nothing to wait for: a call runs once awaitReached says the CUDA
  // stream's earlier work is done (waiting for the context would wait for
  // the held stream).
  Status awaitEarlierWork(const void*, const char*) override { return Status::ok(); }

 private:
  CudaStreamBridge() = default;
  Status inContext(const char* what, const std::function<int()>& work);
  // `status`, once no staging copy is left queued.
  Status finishCopies(Status status);
  // Waits for the staging copies queued on the copy stream, polling, for at
  // most the call's BRAID_TIMEOUT: copies that never run (the copy stream
  // behind the held CUDA stream in one hardware queue) fail the call rather
  // than hold the stream's thread. After that the bridge is stuck.
  Status awaitCopies(const char* what);
  // The half of the pinned memory that piece `piece` of a copy uses.
  uint8_t* half(size_t piece) const;

  void* stream_ = nullptr;        // the caller's CUstream
  void* context_ = nullptr;       // its CUcontext
  void* copyStream_ = nullptr;    // braid's, non-blocking
  void* bounce_ = nullptr;        // pinned, from a pool never freed; null until needed
  uint32_t* released_ = nullptr;  // pinned host memory the CUDA stream reads
  unsigned long long releasedOnGpu_ = 0;
  std::mutex orderMutex_;
  std::mutex holdMutex_;       // one hold() at a time: the signal and the wait stay together
  uint32_t held_ = 0;          // the value of the last hold()
  bool oneWorkQueue_ = false;  // CUDA_DEVICE_MAX_CONNECTIONS=1
  // The timeout of the call being staged (awaitReached's), on the braid
  // stream's thread, which alone stages.
  double copyTimeoutSeconds_ = 300;
  // Copies that did not finish in time: what they may still read or write
  // (the pinned memory, the copy stream) is never reused or freed.
  bool stuck_ = false;
};

}  // namespace braid
