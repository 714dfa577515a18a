// Element types and reduction operators as braid sees them inside; the
// numbering equals braidDataType_t / braidRedOp_t so the ABI maps by value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace braid {

enum class DataType : uint8_t {
  kInt8,
  kUint8,
  kInt32,
  kUint32,
  kInt64,
  kUint64,
  kFloat16,
  kBfloat16,
  kFloat32,
  kFloat64,
};
inline constexpr int kNumDataTypes = 10;

enum class RedOp : uint8_t { kSum, kProd, kMax, kMin, kAvg };
inline constexpr int kNumRedOps = 5;

constexpr size_t dataTypeSize(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8:
      return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

std::string_view dataTypeName(DataType t);
std::string_view redOpName(RedOp op);

}  // namespace braid
