// Where a buffer given to the C ABI lives: host memory, or memory of a GPU.
//
// braid's transports move host memory, so the ABI edge must know a GPU
// buffer for what it is, to stage it through host memory or refuse it with a
// clear message (src/device_staging.h), never to read it as host memory (and
// crash). It
// asks the CUDA driver, but only a driver the process has already loaded
// itself: a CPU-only job never loads libcuda nor creates a context because of
// braid, and every build can do this, with or without CUDA at build time.
#pragma once

#include "src/common/status.h"

namespace braid {

enum class MemoryKind {
  kHost,     // ordinary, pinned or registered host memory
  kDevice,   // GPU device memory (cudaMalloc, cuMemAlloc)
  kManaged,  // CUDA managed (unified) memory (cudaMallocManaged)
};

struct BufferMemory {
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;  // the GPU's ordinal for kDevice and kManaged; -1 if unknown or host
};

// Whether the process has loaded the CUDA driver (libcuda.so.1), and so may
// hold GPU memory at all. Never loads it, and sees a driver loaded before the
// call. Cheap enough for every call: once a driver is found, one load; before,
// the loader's count of loaded objects, and a look for the driver only when a
// library was loaded since the last look.
bool gpuMemoryPossible();

// The kind of memory at `p`, from the driver's cuPointerGetAttribute (which
// needs no current context). Host where the driver is not loaded, does not
// know the address (plain host memory), or holds no GPU memory at all (not
// initialized, shut down, no GPU). Any other answer of the driver (a sticky
// error after a faulting kernel, say) is kUnhandledCudaError with its
// message: the kind is unknown then, and memory read as host that is not
// would crash the process. Thread-safe.
Result<BufferMemory> memoryKindOf(const void* p);

// kInvalidArgument where [p, p + bytes) runs past the end of the GPU
// allocation that holds p (a count too large for the buffer), which the
// driver tells for memory of cudaMalloc or cuMemAlloc. Memory of cuMemCreate
// or of a pool (PyTorch's expandable segments, cudaMallocAsync) is not
// checked: the driver reports one mapping of it, and a buffer may run on
// into the next. Ok too where the driver cannot say. For device or managed
// memory (memoryKindOf).
Status checkInsideGpuAllocation(const void* p, size_t bytes);

// "host", "GPU device", "GPU managed": for messages.
const char* memoryKindName(MemoryKind kind);

}  // namespace braid
