// The soak's exact data: element values, their encodings in every datatype, and reductions.
#include "values.h"

#include <algorithm>
#include <cstring>

namespace soak {

uint32_t hash32(uint32_t x) {
  x *= 0x9e3779b1u;
  x ^= x >> 15;
  x *= 0x85ebca77u;
  x ^= x >> 13;
  return x;
}

Values valuesOf(const Call& c, int rank, int nranks) {
  return {static_cast<uint32_t>(mix64(static_cast<uint64_t>(c.index) * 131 + rank)), c.op,
          static_cast<uint32_t>(nranks)};
}

uint16_t halfBits(float f) {  // exact for the values used here (0 or normal)
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7fffffff) == 0) return static_cast<uint16_t>(b >> 16);
  const uint32_t sign = b >> 31, exponent = ((b >> 23) & 0xff) - 127 + 15,
                 mantissa = (b >> 13) & 0x3ff;
  return static_cast<uint16_t>(sign << 15 | exponent << 10 | mantissa);
}

uint16_t encodeHalf(double v) {
  return halfBits(static_cast<float>(v));
}
uint16_t encodeBfloat16(double v) {
  const float f = static_cast<float>(v);
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>(b >> 16);
}

void fill(void* buffer, size_t offset, size_t n, braidDataType_t t, const Values& v,
          size_t firstIndex) {
  storeAll(buffer, offset, n, t, [&](size_t i) { return static_cast<double>(v(firstIndex + i)); });
}

// op over ranks of element `i` of every rank's values.
double reduceAt(const Call& c, const std::vector<Values>& all, size_t i) {
  double r = all[0](i);
  for (size_t q = 1; q < all.size(); ++q) {
    const double v = all[q](i);
    switch (c.op) {
      case braidProd:
        r *= v;
        break;
      case braidMax:
        r = std::max(r, v);
        break;
      case braidMin:
        r = std::min(r, v);
        break;
      default:
        r += v;
    }
  }
  if (c.op == braidAvg) r /= static_cast<double>(all.size());
  return r;
}

}  // namespace soak
