// What a collective call asks for, as the algorithms see it: sizes in
// elements and bytes, the caller's place in the group, and nothing about
// memory kinds or transports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "src/common/datatype.h"

namespace braid::algo {

enum class CollectiveKind : uint8_t {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter,
  kBarrier,
  kSendRecv,
};

std::string_view collectiveName(CollectiveKind kind);  // "allreduce", ... (BRAID_ALGO spelling)

struct CollectiveArgs {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  size_t count = 0;  // elements per rank, in the ABI's sense for this collective
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  int root = 0;
  int rank = 0;
  int nranks = 1;
  bool inPlace = false;
  size_t chunkBytes = 1 << 19;  // pipelining unit

  size_t elementSize() const { return dataTypeSize(dtype); }
  size_t bytes() const { return count * elementSize(); }
  bool operator==(const CollectiveArgs&) const = default;
};

// Byte sizes of the Send and Recv buffers a collective uses on this rank.
size_t sendBufferBytes(const CollectiveArgs& args);
size_t recvBufferBytes(const CollectiveArgs& args);

}  // namespace braid::algo
