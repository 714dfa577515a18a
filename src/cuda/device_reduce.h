// Element-wise reductions on GPU memory: the device counterparts of
// reduceElements and applyAverage (src/common/reduce.h), with the same
// results bit for bit, so a collective's outcome does not depend on whether
// its buffers live on the host or on a GPU.
//
// Plain C++: callers need no CUDA headers. A stream is a cudaStream_t passed
// as void* (nullptr is the legacy default stream). Every call only enqueues
// work on that stream; errors reported here are launch errors, and errors of
// the kernel itself surface at the next synchronization with the stream.
#pragma once

#include <cstddef>

#include "src/common/datatype.h"
#include "src/common/status.h"

namespace braid::cuda {

// dst[i] = a[i] op b[i] for i < count, all three in device memory. dst may
// alias a or b (exactly, not partially). kAvg reduces as kSum, as on the host;
// averageOnDevice does the division.
Status reduceOnDevice(void* dst, const void* a, const void* b, size_t count, DataType type,
                      RedOp op, void* stream);

// data[i] /= divisor, as applyAverage does on the host (integers truncate
// toward zero; a divisor below 2 leaves data unchanged).
Status averageOnDevice(void* data, size_t count, DataType type, int divisor, void* stream);

// Device-to-device copy of bytes, ordered on the stream.
Status copyOnDevice(void* dst, const void* src, size_t bytes, void* stream);

// Loads every kernel above into the current device's context (again: a
// no-op). Since CUDA 12.2 the runtime loads a kernel at its first launch
// (CUDA_MODULE_LOADING=LAZY), and loading may wait for the whole context.
// braid launches its kernels while a CUDA stream waits for the call, so
// such a wait would never end: callers load them before any stream waits.
// Returns how many kernels it loaded.
Result<int> loadKernels();

}  // namespace braid::cuda
