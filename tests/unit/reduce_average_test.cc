// applyAverage: integers truncate toward zero, floats divide in their own precision.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "src/common/datatype.h"
#include "src/common/reduce.h"
#include "tests/unit/float_reference.h"
#include "tests/unit/reduce_fixtures.h"

namespace braid {
namespace {

using namespace testing_reference;

template <typename T>
std::vector<T> averaged(std::vector<T> values, DataType type, int divisor) {
  applyAverage(values.data(), values.size(), type, divisor);
  return values;
}

TEST(ApplyAverage, IntegersTruncateTowardZero) {
  constexpr int32_t kMin32 = std::numeric_limits<int32_t>::min();
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(
      averaged(std::vector<int32_t>{-7, 7, -8, 9, kMin32, kMax32, 0, -1}, DataType::kInt32, 2),
      (std::vector<int32_t>{-3, 3, -4, 4, -1073741824, 1073741823, 0, 0}));
  EXPECT_EQ(averaged(std::vector<int8_t>{-128, 127, -1, -5, 5}, DataType::kInt8, 3),
            (std::vector<int8_t>{-42, 42, 0, -1, 1}));
  EXPECT_EQ(averaged(std::vector<uint8_t>{255, 7, 1}, DataType::kUint8, 2),
            (std::vector<uint8_t>{127, 3, 0}));
  EXPECT_EQ(averaged(std::vector<uint32_t>{0xFFFFFFFFu, 13}, DataType::kUint32, 7),
            (std::vector<uint32_t>{613566756u, 1}));
  EXPECT_EQ(averaged(std::vector<int64_t>{-9, std::numeric_limits<int64_t>::min(),
                                          std::numeric_limits<int64_t>::max()},
                     DataType::kInt64, 4),
            (std::vector<int64_t>{-2, -2305843009213693952, 2305843009213693951}));
  EXPECT_EQ(averaged(std::vector<uint64_t>{~uint64_t{0}}, DataType::kUint64, 3),
            (std::vector<uint64_t>{6148914691236517205u}));
  EXPECT_EQ(averaged(std::vector<int32_t>{-7, 7}, DataType::kInt32, 1),
            (std::vector<int32_t>{-7, 7}));
}

template <typename T>
void expectIntegerAverageMatchesDivision(DataType type, std::mt19937_64& rng) {
  for (int divisor : {2, 3, 7, 8, 10, 1000, 65537, std::numeric_limits<int>::max()}) {
    for (size_t count : kCounts) {
      std::vector<T> values(count);
      for (T& v : values) v = static_cast<T>(rng());
      std::vector<T> expected = values;
      for (T& v : expected) v = static_cast<T>(v / divisor);  // C's own conversions
      SCOPED_TRACE(std::string(dataTypeName(type)) + " / " + std::to_string(divisor));
      EXPECT_EQ(averaged(values, type, divisor), expected);
    }
  }
}

TEST(ApplyAverage, IntegersMatchCDivisionOnRandomValues) {
  std::mt19937_64 rng(99);
  expectIntegerAverageMatchesDivision<int8_t>(DataType::kInt8, rng);
  expectIntegerAverageMatchesDivision<uint8_t>(DataType::kUint8, rng);
  expectIntegerAverageMatchesDivision<int32_t>(DataType::kInt32, rng);
  expectIntegerAverageMatchesDivision<uint32_t>(DataType::kUint32, rng);
  expectIntegerAverageMatchesDivision<int64_t>(DataType::kInt64, rng);
  expectIntegerAverageMatchesDivision<uint64_t>(DataType::kUint64, rng);
}

TEST(ApplyAverage, FloatsDivideInTheirOwnPrecision) {
  EXPECT_EQ(averaged(std::vector<float>{1.0f, 2.0f, -3.0f, 10.0f}, DataType::kFloat32, 3),
            (std::vector<float>{1.0f / 3.0f, 2.0f / 3.0f, -1.0f, 10.0f / 3.0f}));
  EXPECT_EQ(averaged(std::vector<double>{1.0, -2.0, 1e300}, DataType::kFloat64, 7),
            (std::vector<double>{1.0 / 7.0, -2.0 / 7.0, 1e300 / 7.0}));
  // 2^-24 / 2 ties to 0; 3 * 2^-24 / 2 ties to 2 * 2^-24.
  EXPECT_EQ(averaged(std::vector<uint16_t>{0x3C00, 0x0001, 0x0003, 0xFBFF}, DataType::kFloat16, 2),
            (std::vector<uint16_t>{0x3800, 0x0000, 0x0002, 0xF7FF}));
  // 1/3 = 0x3555; -65504 / 3 = -21834.67 rounds to -21840 (spacing 16 there).
  EXPECT_EQ(averaged(std::vector<uint16_t>{0x3C00, 0xFBFF}, DataType::kFloat16, 3),
            (std::vector<uint16_t>{0x3555, 0xF555}));
  EXPECT_EQ(averaged(std::vector<uint16_t>{0x3F80, 0x0001, 0x0003}, DataType::kBfloat16, 3),
            (std::vector<uint16_t>{0x3EAB, 0x0000, 0x0001}));
}

TEST(ApplyAverage, NarrowFloatsMatchReferenceForEveryValue) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (int divisor : {3, 8}) {
    const auto halves = averaged(all, DataType::kFloat16, divisor);
    const auto bfloats = averaged(all, DataType::kBfloat16, divisor);
    for (uint32_t i = 0; i < all.size(); ++i) {
      const uint16_t h = all[i];
      if (!isHalfNan(h)) {
        ASSERT_EQ(halves[i], refHalfFromFloat(static_cast<float>(refHalfValue(h)) / divisor))
            << std::hex << i << " / " << divisor;
      }
      if (!isBfloat16Nan(h)) {
        ASSERT_EQ(bfloats[i], refBfloat16FromFloat(refBfloat16Value(h) / divisor))
            << std::hex << i << " / " << divisor;
      }
    }
  }
}

}  // namespace
}  // namespace braid
