// The soak's data, which make every result exact: each rank's values and their reductions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "soak.h"

namespace soak {

// ---------------------------------------------------------------------------
// Data that make every result exact: small integers, whose sums, products,
// maxima and averages over a few ranks every datatype holds exactly.

uint32_t hash32(uint32_t x);

// Every partial result stays at most 127: exact in bf16 (8 significant
// bits; fp16 and bf16 round each partial result) and no overflow in int8.
struct Values {
  uint32_t key;
  braidRedOp_t op;
  uint32_t nranks;
  // The value of element i.
  uint32_t operator()(size_t i) const {
    const uint32_t h = hash32(static_cast<uint32_t>(i) * 0x27d4eb2fu ^ key);
    switch (op) {
      case braidProd:
        return nranks <= 6 ? 1 + (h >> 31) : 1;  // 1 or 2
      case braidMax:
      case braidMin:
        return h % 101;
      case braidAvg:
        // Multiples of nranks: the average is a whole number in any type.
        return nranks * (h % (127 / nranks / nranks + 1));
      default:
        return h % (127 / nranks + 1);
    }
  }
};

Values valuesOf(const Call& c, int rank, int nranks);

// Element i of a buffer of type T holding the value v.
template <typename T>
T encode(double v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<int64_t>(v));  // wraps, as braid's integers do
  } else {
    return static_cast<T>(v);
  }
}
uint16_t encodeHalf(double v);
uint16_t encodeBfloat16(double v);

template <typename T, typename Encode, typename Value>
void storeEach(void* buffer, size_t offset, size_t n, Encode encode, Value value) {
  T* p = static_cast<T*>(buffer) + offset;
  for (size_t i = 0; i < n; ++i) p[i] = encode(value(i));
}

// Writes value(i) as elements offset + i, i < n, of a buffer of type t.
template <typename Value>
void storeAll(void* buffer, size_t offset, size_t n, braidDataType_t t, Value value) {
  switch (t) {
    case braidInt8:
      return storeEach<int8_t>(buffer, offset, n, encode<int8_t>, value);
    case braidUint8:
      return storeEach<uint8_t>(buffer, offset, n, encode<uint8_t>, value);
    case braidInt32:
      return storeEach<int32_t>(buffer, offset, n, encode<int32_t>, value);
    case braidUint32:
      return storeEach<uint32_t>(buffer, offset, n, encode<uint32_t>, value);
    case braidInt64:
      return storeEach<int64_t>(buffer, offset, n, encode<int64_t>, value);
    case braidUint64:
      return storeEach<uint64_t>(buffer, offset, n, encode<uint64_t>, value);
    case braidFloat16:
      return storeEach<uint16_t>(buffer, offset, n, encodeHalf, value);
    case braidBfloat16:
      return storeEach<uint16_t>(buffer, offset, n, encodeBfloat16, value);
    case braidFloat32:
      return storeEach<float>(buffer, offset, n, encode<float>, value);
    default:
      return storeEach<double>(buffer, offset, n, encode<double>, value);
  }
}

void fill(void* buffer, size_t offset, size_t n, braidDataType_t t, const Values& v,
          size_t firstIndex);

// op over ranks of element `i` of every rank's values.
double reduceAt(const Call& c, const std::vector<Values>& all, size_t i);

}  // namespace soak
