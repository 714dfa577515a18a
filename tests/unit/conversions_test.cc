// fp16 and bf16 conversions: every bit pattern round-trips, every rounding
// midpoint goes to even, and a spread of fp32 values matches the reference.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "src/common/reduce.h"
#include "tests/unit/float_reference.h"

namespace braid {
namespace {

using namespace testing_reference;

TEST(Conversions, HalfRoundTripsEveryBitPattern) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = halfToFloat(h);
    if (isHalfNan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << bits;
      ASSERT_TRUE(isHalfNan(floatToHalf(f))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(f),
              std::bit_cast<uint32_t>(static_cast<float>(refHalfValue(h))))
        << std::hex << bits;
    ASSERT_EQ(floatToHalf(f), h) << std::hex << bits;
  }
}

TEST(Conversions, Bfloat16RoundTripsEveryBitPattern) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const float f = bfloat16ToFloat(b);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), bits << 16) << std::hex << bits;
    if (isBfloat16Nan(b)) {
      ASSERT_TRUE(isBfloat16Nan(floatToBfloat16(f))) << std::hex << bits;
    } else {
      ASSERT_EQ(floatToBfloat16(f), b) << std::hex << bits;
    }
  }
}

// Every midpoint between neighbouring finite halves, and the floats just
// either side of it: the exact places where rounding can go wrong.
TEST(Conversions, FloatToHalfRoundsMidpointsToEven) {
  for (uint16_t h = 0; h < 0x7BFF; ++h) {
    const float low = static_cast<float>(refHalfValue(h));
    const float high = static_cast<float>(refHalfValue(static_cast<uint16_t>(h + 1)));
    const float mid = (low + high) / 2;  // exact: a half needs 11 bits, fp32 has 24
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : h;
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t signBit = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(floatToHalf(sign * mid), signBit | even) << std::hex << h;
      ASSERT_EQ(floatToHalf(sign * std::nextafter(mid, 0.0f)), signBit | h) << std::hex << h;
      ASSERT_EQ(floatToHalf(sign * std::nextafter(mid, 1e9f)), signBit | (h + 1)) << std::hex << h;
    }
  }
  EXPECT_EQ(floatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7C00);
  EXPECT_EQ(floatToHalf(-1e30f), 0xFC00);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(floatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(isHalfNan(floatToHalf(std::numeric_limits<float>::quiet_NaN())));
}

// A spread of fp32 bit patterns over the whole range, both conversions
// against their references.
TEST(Conversions, NarrowingMatchesReferenceAcrossFloatRange) {
  constexpr uint64_t kStride = 4093;  // prime, so the low bits vary too
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += kStride) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (std::isnan(f)) {
      ASSERT_TRUE(isHalfNan(floatToHalf(f))) << std::hex << bits;
      ASSERT_TRUE(isBfloat16Nan(floatToBfloat16(f))) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(floatToHalf(f), refHalfFromFloat(f)) << std::hex << bits;
    ASSERT_EQ(floatToBfloat16(f), refBfloat16FromFloat(f)) << std::hex << bits;
  }
  EXPECT_EQ(floatToBfloat16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(floatToBfloat16(std::bit_cast<float>(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(floatToBfloat16(std::bit_cast<float>(0x00008000u)), 0x0000);  // tie to even
  EXPECT_EQ(floatToBfloat16(std::bit_cast<float>(0x00018000u)), 0x0002);  // tie to even
  // A NaN whose payload lies only in the dropped bits must stay NaN.
  EXPECT_TRUE(isBfloat16Nan(floatToBfloat16(std::bit_cast<float>(0x7F800001u))));
}

}  // namespace
}  // namespace braid
