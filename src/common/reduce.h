// Element-wise reductions on host memory, the arithmetic of every reducing
// collective. fp16/bf16 are widened to fp32 for each pairwise operation and
// rounded back to nearest-even; integer sums and products wrap.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/common/datatype.h"

namespace braid {

// dst[i] = a[i] op b[i] for i < count. dst may alias a or b (exactly, not
// partially). kAvg reduces as kSum; the division is applyAverage's job.
void reduceElements(void* dst, const void* a, const void* b, size_t count, DataType type, RedOp op);

// data[i] /= divisor (integers truncate toward zero), for the final step of kAvg.
// The divisor is a rank count: a value below 2 leaves data unchanged.
void applyAverage(void* data, size_t count, DataType type, int divisor);

// Conversions used by the kernels and by tests that build expected values.
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);

// The instruction-set paths of reduceElements, for tests and benchmarks that
// must run each one; the library itself picks the best the CPU has, once.
namespace reduce_internal {

enum class ReduceIsa : uint8_t { kPortable, kAvx2, kAvx512 };

// True when this build has the path and this CPU (and OS) can run it.
bool reduceIsaAvailable(ReduceIsa isa);
// The path reduceElements uses.
ReduceIsa reduceIsaSelected();
const char* reduceIsaName(ReduceIsa isa);
// reduceElements on a given path, which must be available.
void reduceElementsWithIsa(ReduceIsa isa, void* dst, const void* a, const void* b, size_t count,
                           DataType type, RedOp op);

}  // namespace reduce_internal

}  // namespace braid
