// Reference fp16/bf16 conversions written from the formats' definitions
// (not the bit tricks the kernels use), shared by the reduction and the
// conversion tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace braid::testing_reference {

inline bool isHalfNan(uint16_t h) {
  return (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0;
}
inline bool isBfloat16Nan(uint16_t b) {
  return (b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0;
}

// The value of a half from the definition of the format.
inline double refHalfValue(uint16_t h) {
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x03FF;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN()
                         : std::numeric_limits<double>::infinity();
  } else {
    magnitude = std::ldexp(mantissa + 1024, exponent - 25);
  }
  return (h & 0x8000) ? -magnitude : magnitude;
}

// Nearest half, ties to the even bit pattern. Positive halves are ordered
// like their bit patterns, so a binary search finds the neighbours.
inline uint16_t refHalfFromFloat(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7E00;
  const double target = std::fabs(static_cast<double>(f));
  if (target >= 65520.0) return sign | 0x7C00;  // 65520 is the tie between 65504 and 2^16
  uint16_t low = 0, high = 0x7BFF;              // largest finite half whose value <= target
  while (low < high) {
    const uint16_t mid = static_cast<uint16_t>((low + high + 1) / 2);
    if (refHalfValue(mid) <= target) {
      low = mid;
    } else {
      high = static_cast<uint16_t>(mid - 1);
    }
  }
  if (low == 0x7BFF) return sign | low;
  const double below = target - refHalfValue(low);
  const double above = refHalfValue(static_cast<uint16_t>(low + 1)) - target;
  const bool roundUp = above < below || (above == below && (low & 1));
  return sign | static_cast<uint16_t>(low + (roundUp ? 1 : 0));
}

inline float refBfloat16Value(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// Nearest bfloat16: of the two fp32 values with zero low halves around f,
// the closer one, ties to the even bit pattern; past the largest finite, Inf.
inline uint16_t refBfloat16FromFloat(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = bits & 0x80000000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<uint16_t>((sign | 0x7FC00000u) >> 16);
  if (magnitude == 0x7F800000u) return static_cast<uint16_t>(bits >> 16);
  const uint32_t low = magnitude & 0xFFFF0000u;
  const uint32_t high = low + 0x10000u;
  const double target = std::fabs(static_cast<double>(f));
  const double lowValue = std::bit_cast<float>(low);
  const double highValue =
      high == 0x7F800000u ? std::ldexp(1.0, 128) : static_cast<double>(std::bit_cast<float>(high));
  const double below = target - lowValue;
  const double above = highValue - target;
  const bool roundUp = above < below || (above == below && ((low >> 16) & 1));
  return static_cast<uint16_t>((sign | (roundUp ? high : low)) >> 16);
}

}  // namespace braid::testing_reference
