#include "src/call_signature.h"

#include "algorithms/collective.h"
#include "src/common/strcat.h"

namespace braid {

uint64_t CallSignature::pack() const {
  return (uint64_t{kind} & 0xf) | (static_cast<uint64_t>(dtype) & 0xf) << 4 |
         (static_cast<uint64_t>(op) & 0xf) << 8 |
         (static_cast<uint64_t>(root + 1) & 0x7ffff) << 12 | (gpuMemory ? kGpuMemoryBit : 0) |
         (count & 0xffffffff) << 32;
}

CallSignature CallSignature::unpack(uint64_t check) {
  CallSignature s;
  s.kind = check & 0xf;
  s.dtype = static_cast<DataType>((check >> 4) & 0xf);
  s.op = static_cast<RedOp>((check >> 8) & 0xf);
  s.root = static_cast<int>((check >> 12) & 0x7ffff) - 1;
  s.gpuMemory = (check & kGpuMemoryBit) != 0;
  s.count = check >> 32;
  return s;
}

std::string CallSignature::describe() const {
  auto kindEnum = static_cast<algo::CollectiveKind>(kind);
  std::string out =
      strCat(algo::collectiveName(kindEnum), "(count=", count, ", ", dataTypeName(dtype));
  bool reduces = kindEnum == algo::CollectiveKind::kAllReduce ||
                 kindEnum == algo::CollectiveKind::kReduce ||
                 kindEnum == algo::CollectiveKind::kReduceScatter;
  if (reduces) out += strCat(", ", redOpName(op));
  if (root >= 0) out += strCat(", root=", root);
  if (gpuMemory) out += ", GPU memory";
  return out + ")";
}

}  // namespace braid
