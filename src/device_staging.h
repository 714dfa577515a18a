// GPU buffers staged through host memory. A call given GPU buffers that runs
// on the calling thread (stream NULL, outside a group) waits for the GPU,
// copies the buffers to host memory, runs as a host call, and copies the
// result back: every transport and algorithm then serves GPU memory
// unchanged, at the price of two copies and a wait. Stream-ordered calls and
// copies that overlap the wire are later steps (docs/GPU.md).
//
// The copies go through the CUDA driver the process has loaded (never loaded
// by braid, see memory_kind.h), each in the context that owns the buffer, so
// the calling thread needs no current context.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "src/common/status.h"

namespace braid {

// Whether this build stages GPU buffers (a CUDA build); otherwise they are
// refused with braidNotSupported.
bool gpuStagingBuilt();

// How staging copies GPU memory to and from host memory.
class GpuCopies {
 public:
  virtual ~GpuCopies() = default;
  // Copies GPU `gpu` to host `host`; the data is in `host` when it returns.
  virtual Status toHost(void* host, const void* gpu, size_t bytes, const char* what) = 0;
  // Copies host `host` to GPU `gpu`; work queued on the GPU after it returns
  // sees the data.
  virtual Status toGpu(void* gpu, const void* host, size_t bytes, const char* what) = 0;
  // Returns once the work queued on `gpu`'s GPU before the call is done, for
  // a call that reads `gpu` on the GPU itself (a GPU job) rather than
  // through these copies.
  virtual Status awaitEarlierWork(const void* gpu, const char* what) = 0;
};

// For calls on the calling thread (stream NULL): each copy waits for all
// work queued on the buffer's context, on every stream, before (toHost) or
// after (toGpu) it.
GpuCopies& contextOrderedCopies();

// Waits for all work queued on the context that owns `gpu` (every stream):
// what the caller queued before a call on stream NULL has written its
// buffers when this returns.
Status waitForGpuWork(const void* gpu, const char* what);

// The driver's error `result` of `what` as a Status with the code of
// braidUnhandledCudaError and CUDA's message.
Status cudaDriverError(int result, const std::string& what);

class StagedBuffers {
 public:
  // Stages whichever of send (sendBytes) and recv (recvBytes) is on a GPU.
  // Each is copied to host memory after all work queued on its GPU has
  // finished; recv too, so that what a call leaves alone comes back as it
  // was. Buffers of a call in place (one inside the other) are staged once,
  // as the one that encloses the other.
  static Result<StagedBuffers> stage(const void* send, size_t sendBytes, bool sendOnGpu, void* recv,
                                     size_t recvBytes, bool recvOnGpu, GpuCopies& copies);

  // The pointers the call uses: host copies, or the caller's host buffers.
  const void* send() const { return send_; }
  void* recv() const { return recv_; }

  // Copies the host recv back to its GPU and waits for the copy.
  Status finish();

 private:
  GpuCopies* copies_ = nullptr;
  std::vector<std::byte> sendCopy_, recvCopy_;
  const void* send_ = nullptr;
  void* recv_ = nullptr;
  void* gpuRecv_ =
      nullptr;  // the caller's recv when it is on a GPU (the enclosing buffer in place)
};

}  // namespace braid
