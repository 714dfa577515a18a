// The check word every message of a call carries, and every rank announces
// on the board: what the call's peers must agree on, so that ranks that made
// different calls fail naming both instead of waiting.
#pragma once

#include <cstdint>
#include <string>

#include "src/common/datatype.h"

namespace braid {

// What a call's peers must agree on, packed into a frame's check word:
// kind, datatype, op, root and count. Both sides of every message compare it.
struct CallSignature {
  uint8_t kind = 0;  // algo::CollectiveKind
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  int root = -1;  // below 2^19 - 1
  uint64_t count = 0;
  // The call runs as a GPU job (src/gpu_path.h), whose messages a peer
  // running it on host memory never meets: every rank passes GPU buffers,
  // or every rank host buffers.
  bool gpuMemory = false;
  static constexpr uint64_t kGpuMemoryBit = uint64_t{1} << 31;  // where pack() puts gpuMemory

  uint64_t pack() const;
  static CallSignature unpack(uint64_t check);
  std::string describe() const;  // "allreduce(count=1000, float32, sum)"
};

}  // namespace braid
