// The reduction kernels for every type, operator and instruction-set path, against references.
#include "src/common/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "src/common/datatype.h"
#include "tests/unit/float_reference.h"
#include "tests/unit/reduce_fixtures.h"

namespace braid {
namespace {

using namespace testing_reference;

__extension__ typedef __int128 Int128;
__extension__ typedef unsigned __int128 Uint128;

constexpr DataType kAllTypes[] = {
    DataType::kInt8,    DataType::kUint8,   DataType::kInt32,   DataType::kUint32,
    DataType::kInt64,   DataType::kUint64,  DataType::kFloat16, DataType::kBfloat16,
    DataType::kFloat32, DataType::kFloat64,
};
constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};

// ---- Reference reductions ----

// Written for clarity rather than speed: integer results from exact wide
// arithmetic reduced modulo 2^bits, and fp16/bf16 rounding from distances to
// neighbouring representable values rather than the bit tricks the kernels use.

template <typename T>
T refCombine(RedOp op, T a, T b) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
    case RedOp::kProd:
      if constexpr (std::is_integral_v<T>) {
        // Wide enough for the exact result; the cast back is modulo 2^bits.
        using Signed = std::conditional_t<sizeof(T) < 8, int64_t, Int128>;
        using Unsigned = std::conditional_t<sizeof(T) < 8, uint64_t, Uint128>;
        using Exact = std::conditional_t<std::is_signed_v<T>, Signed, Unsigned>;
        const Exact x = a, y = b;
        return static_cast<T>(op == RedOp::kProd ? x * y : x + y);
      } else {
        return op == RedOp::kProd ? a * b : a + b;
      }
    case RedOp::kMax:
      return std::max(a, b);
    case RedOp::kMin:
      return std::min(a, b);
  }
  return T{};
}

using Bytes = std::vector<uint8_t>;

template <typename T>
T load(const Bytes& bytes, size_t i) {
  T value;
  std::memcpy(&value, bytes.data() + i * sizeof(T), sizeof(T));
  return value;
}

template <typename T>
void store(Bytes& bytes, size_t i, T value) {
  std::memcpy(bytes.data() + i * sizeof(T), &value, sizeof(T));
}

// Widen to fp32, combine in fp32, round back: the documented semantics.
uint16_t refNarrow(DataType type, RedOp op, uint16_t a, uint16_t b) {
  if (type == DataType::kFloat16) {
    const float x = static_cast<float>(refHalfValue(a)), y = static_cast<float>(refHalfValue(b));
    return refHalfFromFloat(refCombine(op, x, y));
  }
  return refBfloat16FromFloat(refCombine(op, refBfloat16Value(a), refBfloat16Value(b)));
}

Bytes reference(DataType type, RedOp op, const Bytes& a, const Bytes& b, size_t count) {
  Bytes out(count * dataTypeSize(type));
  for (size_t i = 0; i < count; ++i) {
    switch (type) {
      case DataType::kInt8:
        store(out, i, refCombine(op, load<int8_t>(a, i), load<int8_t>(b, i)));
        break;
      case DataType::kUint8:
        store(out, i, refCombine(op, load<uint8_t>(a, i), load<uint8_t>(b, i)));
        break;
      case DataType::kInt32:
        store(out, i, refCombine(op, load<int32_t>(a, i), load<int32_t>(b, i)));
        break;
      case DataType::kUint32:
        store(out, i, refCombine(op, load<uint32_t>(a, i), load<uint32_t>(b, i)));
        break;
      case DataType::kInt64:
        store(out, i, refCombine(op, load<int64_t>(a, i), load<int64_t>(b, i)));
        break;
      case DataType::kUint64:
        store(out, i, refCombine(op, load<uint64_t>(a, i), load<uint64_t>(b, i)));
        break;
      case DataType::kFloat16:
      case DataType::kBfloat16:
        store(out, i, refNarrow(type, op, load<uint16_t>(a, i), load<uint16_t>(b, i)));
        break;
      case DataType::kFloat32:
        store(out, i, refCombine(op, load<float>(a, i), load<float>(b, i)));
        break;
      case DataType::kFloat64:
        store(out, i, refCombine(op, load<double>(a, i), load<double>(b, i)));
        break;
    }
  }
  return out;
}

// Integers: any bits. Floats: [-100, 100]. fp16/bf16: any bits except NaN,
// so subnormals, Inf and overflow all occur; Inf - Inf gives NaN in sums.
Bytes randomOperand(DataType type, size_t count, std::mt19937_64& rng) {
  Bytes bytes(count * dataTypeSize(type));
  std::uniform_real_distribution<double> real(-100.0, 100.0);
  for (size_t i = 0; i < count; ++i) {
    switch (type) {
      case DataType::kFloat32:
        store(bytes, i, static_cast<float>(real(rng)));
        break;
      case DataType::kFloat64:
        store(bytes, i, real(rng));
        break;
      case DataType::kFloat16:
      case DataType::kBfloat16: {
        uint16_t bits;
        do {
          bits = static_cast<uint16_t>(rng());
        } while (type == DataType::kFloat16 ? isHalfNan(bits) : isBfloat16Nan(bits));
        store(bytes, i, bits);
        break;
      }
      default: {
        const uint64_t bits = rng();
        std::memcpy(bytes.data() + i * dataTypeSize(type), &bits, dataTypeSize(type));
      }
    }
  }
  return bytes;
}

bool isNanElement(DataType type, const uint8_t* p) {
  uint16_t narrow;
  float single;
  double wide;
  switch (type) {
    case DataType::kFloat16:
      std::memcpy(&narrow, p, 2);
      return isHalfNan(narrow);
    case DataType::kBfloat16:
      std::memcpy(&narrow, p, 2);
      return isBfloat16Nan(narrow);
    case DataType::kFloat32:
      std::memcpy(&single, p, 4);
      return std::isnan(single);
    case DataType::kFloat64:
      std::memcpy(&wide, p, 8);
      return std::isnan(wide);
    default:
      return false;
  }
}

std::string hex(const uint8_t* p, size_t size) {
  static const char kDigits[] = "0123456789abcdef";
  std::string text = "0x";
  for (size_t k = size; k-- > 0;) {
    text += kDigits[p[k] >> 4];
    text += kDigits[p[k] & 0xF];
  }
  return text;
}

// Exact bits, except that a NaN may be any NaN. Reports the first mismatch.
void expectSameElements(DataType type, const Bytes& expected, const uint8_t* actual, size_t count) {
  const size_t size = dataTypeSize(type);
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* want = expected.data() + i * size;
    const uint8_t* got = actual + i * size;
    if (isNanElement(type, want) && isNanElement(type, got)) continue;
    if (std::memcmp(want, got, size) != 0) {
      ADD_FAILURE() << "element " << i << " of " << count << ": expected " << hex(want, size)
                    << ", got " << hex(got, size);
      return;
    }
  }
}

std::string describe(DataType type, RedOp op, size_t count) {
  return std::string(dataTypeName(type)) + " " + std::string(redOpName(op)) +
         " count=" + std::to_string(count);
}

// ---- Every type and operator against the reference ----

TEST(ReduceElements, MatchesReferenceForEveryTypeOpAndCount) {
  std::mt19937_64 rng(20240611);
  for (DataType type : kAllTypes) {
    for (RedOp op : kAllOps) {
      for (size_t count : kCounts) {
        SCOPED_TRACE(describe(type, op, count));
        const Bytes a = randomOperand(type, count, rng);
        const Bytes b = randomOperand(type, count, rng);
        const Bytes expected = reference(type, op, a, b, count);
        // Guard bytes after the output catch writes past count.
        const size_t size = count * dataTypeSize(type);
        Bytes out(size + 64, 0xA5);
        reduceElements(out.data(), a.data(), b.data(), count, type, op);
        expectSameElements(type, expected, out.data(), count);
        EXPECT_TRUE(std::all_of(out.begin() + static_cast<ptrdiff_t>(size), out.end(),
                                [](uint8_t v) { return v == 0xA5; }))
            << "wrote past count";
      }
    }
  }
}

TEST(ReduceElements, OutputMayAliasEitherInput) {
  std::mt19937_64 rng(7);
  for (DataType type : kAllTypes) {
    for (RedOp op : kAllOps) {
      for (size_t count : {size_t{257}, size_t{1000}}) {
        SCOPED_TRACE(describe(type, op, count));
        const Bytes a = randomOperand(type, count, rng);
        const Bytes b = randomOperand(type, count, rng);

        Bytes intoA = a;
        reduceElements(intoA.data(), intoA.data(), b.data(), count, type, op);
        expectSameElements(type, reference(type, op, a, b, count), intoA.data(), count);

        Bytes intoB = b;
        reduceElements(intoB.data(), a.data(), intoB.data(), count, type, op);
        expectSameElements(type, reference(type, op, a, b, count), intoB.data(), count);

        Bytes all = a;
        reduceElements(all.data(), all.data(), all.data(), count, type, op);
        expectSameElements(type, reference(type, op, a, a, count), all.data(), count);
      }
    }
  }
}

TEST(ReduceElements, ZeroCountTouchesNothing) {
  for (DataType type : kAllTypes) {
    for (RedOp op : kAllOps) {
      reduceElements(nullptr, nullptr, nullptr, 0, type, op);
      Bytes out(16, 0x5A);
      const Bytes in(16, 0x11);
      reduceElements(out.data(), in.data(), in.data(), 0, type, op);
      EXPECT_EQ(out, Bytes(16, 0x5A)) << describe(type, op, 0);
    }
  }
}

// ---- Hand-picked edges with exact expected values ----

// They pin the edges (wrap-around, ties, subnormals, overflow to Inf) to exact
// expected bits.

template <typename T>
std::vector<T> reduced(const std::vector<T>& a, const std::vector<T>& b, DataType type, RedOp op) {
  std::vector<T> out(a.size());
  reduceElements(out.data(), a.data(), b.data(), a.size(), type, op);
  return out;
}

TEST(ReduceElements, IntegerSumsAndProductsWrap) {
  using V8 = std::vector<int8_t>;
  using U8 = std::vector<uint8_t>;
  EXPECT_EQ(reduced(V8{100, -128, 127, -1}, V8{100, -1, 1, 1}, DataType::kInt8, RedOp::kSum),
            (V8{-56, 127, -128, 0}));
  EXPECT_EQ(reduced(V8{16, -128, 3, -7}, V8{16, -1, -50, 5}, DataType::kInt8, RedOp::kProd),
            (V8{0, -128, 106, -35}));
  EXPECT_EQ(reduced(U8{200, 255, 0}, U8{100, 1, 0}, DataType::kUint8, RedOp::kSum), (U8{44, 0, 0}));
  EXPECT_EQ(reduced(U8{16, 255, 15}, U8{16, 255, 17}, DataType::kUint8, RedOp::kProd),
            (U8{0, 1, 255}));

  using V32 = std::vector<int32_t>;
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin32 = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(reduced(V32{kMax32, kMin32, -5}, V32{1, -1, 3}, DataType::kInt32, RedOp::kSum),
            (V32{kMin32, kMax32, -2}));
  EXPECT_EQ(reduced(V32{65536, 65537, kMin32, -3}, V32{65536, 65537, -1, 7}, DataType::kInt32,
                    RedOp::kProd),
            (V32{0, 131073, kMin32, -21}));
  EXPECT_EQ(reduced(std::vector<uint32_t>{0xFFFFFFFFu}, std::vector<uint32_t>{2}, DataType::kUint32,
                    RedOp::kSum),
            std::vector<uint32_t>{1});

  using V64 = std::vector<int64_t>;
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(reduced(V64{kMax64}, V64{1}, DataType::kInt64, RedOp::kSum), V64{kMin64});
  EXPECT_EQ(reduced(V64{kMin64, (int64_t{1} << 32) + 1}, V64{-1, (int64_t{1} << 32) + 1},
                    DataType::kInt64, RedOp::kProd),
            (V64{kMin64, (int64_t{1} << 33) + 1}));
  EXPECT_EQ(reduced(std::vector<uint64_t>{~uint64_t{0}}, std::vector<uint64_t>{~uint64_t{0}},
                    DataType::kUint64, RedOp::kProd),
            std::vector<uint64_t>{1});
}

TEST(ReduceElements, MaxAndMinOrderNegativesAndLargeUnsigned) {
  using V8 = std::vector<int8_t>;
  EXPECT_EQ(reduced(V8{-5, -128, 3}, V8{-7, 127, -3}, DataType::kInt8, RedOp::kMax),
            (V8{-5, 127, 3}));
  EXPECT_EQ(reduced(V8{-5, -128, 3}, V8{-7, 127, -3}, DataType::kInt8, RedOp::kMin),
            (V8{-7, -128, -3}));
  using U8 = std::vector<uint8_t>;
  EXPECT_EQ(reduced(U8{200, 1}, U8{100, 255}, DataType::kUint8, RedOp::kMax), (U8{200, 255}));
  EXPECT_EQ(reduced(U8{200, 1}, U8{100, 255}, DataType::kUint8, RedOp::kMin), (U8{100, 1}));
  using U32 = std::vector<uint32_t>;
  EXPECT_EQ(reduced(U32{0x80000000u, 1}, U32{1, 0xFFFFFFFFu}, DataType::kUint32, RedOp::kMax),
            (U32{0x80000000u, 0xFFFFFFFFu}));
  using U64 = std::vector<uint64_t>;
  EXPECT_EQ(reduced(U64{uint64_t{1} << 63, 1}, U64{1, 2}, DataType::kUint64, RedOp::kMin),
            (U64{1, 1}));
  using V64 = std::vector<int64_t>;
  EXPECT_EQ(reduced(V64{-1, -(int64_t{1} << 40)}, V64{-2, 5}, DataType::kInt64, RedOp::kMax),
            (V64{-1, 5}));
  using F32 = std::vector<float>;
  EXPECT_EQ(reduced(F32{-1.5f, -0.25f}, F32{-2.5f, -3.0f}, DataType::kFloat32, RedOp::kMax),
            (F32{-1.5f, -0.25f}));
  EXPECT_EQ(reduced(F32{-1.5f, -0.25f}, F32{-2.5f, -3.0f}, DataType::kFloat32, RedOp::kMin),
            (F32{-2.5f, -3.0f}));
  using F16 = std::vector<uint16_t>;  // as fp16: -1 vs -2, -65504 vs 0.5
  EXPECT_EQ(reduced(F16{0xBC00, 0xFBFF}, F16{0xC000, 0x3800}, DataType::kFloat16, RedOp::kMax),
            (F16{0xBC00, 0x3800}));
  EXPECT_EQ(reduced(F16{0xBC00, 0xFBFF}, F16{0xC000, 0x3800}, DataType::kBfloat16, RedOp::kMin),
            (F16{0xC000, 0xFBFF}));
}

TEST(ReduceElements, Float16RoundsToNearestEven) {
  using H = std::vector<uint16_t>;
  auto sum = [](H a, H b) { return reduced(a, b, DataType::kFloat16, RedOp::kSum); };
  auto prod = [](H a, H b) { return reduced(a, b, DataType::kFloat16, RedOp::kProd); };
  // 1 + 2^-11 is the tie between 1 and 1 + 2^-10: to even, 1. One ulp more
  // in the addend breaks the tie upward; from 1 + 2^-10 the tie goes up.
  EXPECT_EQ(sum(H{0x3C00, 0x3C00, 0x3C01}, H{0x1000, 0x1001, 0x1000}), (H{0x3C00, 0x3C01, 0x3C02}));
  // Subnormals add exactly, carry into the smallest normal, and cancel to +0.
  EXPECT_EQ(sum(H{0x0001, 0x03FF, 0x8001}, H{0x0001, 0x0001, 0x0001}), (H{0x0002, 0x0400, 0x0000}));
  // 65504 + 65504 overflows; 65504 + 16 is the tie at 65520, to even = Inf;
  // 65504 + 8 rounds back to 65504. Inf + 1 stays Inf.
  EXPECT_EQ(
      sum(H{0x7BFF, 0x7BFF, 0x7BFF, 0x7C00, 0xFC00}, H{0x7BFF, 0x4C00, 0x4800, 0x3C00, 0x3C00}),
      (H{0x7C00, 0x7C00, 0x7BFF, 0x7C00, 0xFC00}));
  const H nan = sum(H{0x7C00}, H{0xFC00});
  EXPECT_TRUE(isHalfNan(nan[0])) << std::hex << nan[0];
  // 2^-12 * 2^-12 = 2^-24, the smallest subnormal; 2^-12 * 2^-13 is the tie
  // between 0 and it (to 0); 1.5 * 2^-25 rounds up; 2^-9 * 2^-9 = 2^-18.
  EXPECT_EQ(prod(H{0x0C00, 0x0C00, 0x0E00, 0x1800}, H{0x0C00, 0x0800, 0x0800, 0x1800}),
            (H{0x0001, 0x0000, 0x0001, 0x0040}));
  // (1 + 2^-10)^2 = 1 + 2^-9 + 2^-20 rounds to 1 + 2^-9; 256 * 256 overflows.
  EXPECT_EQ(prod(H{0x3C01, 0x5C00}, H{0x3C01, 0x5C00}), (H{0x3C02, 0x7C00}));
}

TEST(ReduceElements, Bfloat16RoundsToNearestEven) {
  using B = std::vector<uint16_t>;
  auto sum = [](B a, B b) { return reduced(a, b, DataType::kBfloat16, RedOp::kSum); };
  auto prod = [](B a, B b) { return reduced(a, b, DataType::kBfloat16, RedOp::kProd); };
  // 1 + 2^-8 ties between 1 and 1 + 2^-7 (to 1); from 1 + 2^-7 it goes up.
  EXPECT_EQ(sum(B{0x3F80, 0x3F81, 0x3F80}, B{0x3B80, 0x3B80, 0x3B81}), (B{0x3F80, 0x3F82, 0x3F81}));
  // Subnormals, overflow of the largest finite value, Inf + finite.
  EXPECT_EQ(sum(B{0x0001, 0x007F, 0x7F7F, 0xFF80}, B{0x0001, 0x0001, 0x7F7F, 0x3F80}),
            (B{0x0002, 0x0080, 0x7F80, 0xFF80}));
  const B nan = sum(B{0x7F80}, B{0xFF80});
  EXPECT_TRUE(isBfloat16Nan(nan[0])) << std::hex << nan[0];
  // 1.5^2 = 2.25 exactly; (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 rounds to 1 + 2^-6.
  EXPECT_EQ(prod(B{0x3FC0, 0x3F81}, B{0x3FC0, 0x3F81}), (B{0x4010, 0x3F82}));
}

// ---- Every instruction-set path against the portable one ----
//
// The paths must agree bit for bit, NaN encodings included: a collective's
// result must not depend on which CPU of a heterogeneous job reduced a chunk.
// The one freedom: a sum or product of two NaNs may carry either one's sign
// and payload. x86 returns the first source operand, and GCC commutes the
// operands of + and * at will, in the portable loops too (see reduce.cc).

// Random bits, with a third of the elements drawn from the values where
// vector instructions differ from scalar code if anything does: NaNs of both
// signs (quiet and signalling, several payloads), infinities, zeros of both
// signs, subnormals and the extremes of the normal range.
Bytes edgeOperand(DataType type, size_t count, std::mt19937_64& rng) {
  static const uint16_t kHalf[] = {0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01,
                                   0xFD55, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00};
  static const uint16_t kBfloat[] = {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81,
                                     0xFFA5, 0x0001, 0x807F, 0x0080, 0x7F7F, 0xFF7F, 0x3F80};
  static const uint32_t kSingle[] = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                                     0xFFC00000, 0x7F800001, 0xFFA5A5A5, 0x00000001, 0x807FFFFF,
                                     0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000};
  static const uint64_t kDouble[] = {0x0,
                                     0x8000000000000000,
                                     0x7FF0000000000000,
                                     0xFFF0000000000000,
                                     0x7FF8000000000000,
                                     0xFFF8000000000000,
                                     0x7FF0000000000001,
                                     0xFFFA5A5A5A5A5A5A,
                                     0x1,
                                     0x800FFFFFFFFFFFFF,
                                     0x0010000000000000,
                                     0x7FEFFFFFFFFFFFFF,
                                     0xFFEFFFFFFFFFFFFF,
                                     0x3FF0000000000000};
  const size_t size = dataTypeSize(type);
  Bytes bytes(count * size);
  for (size_t i = 0; i < count; ++i) {
    uint64_t bits = rng();
    if (bits % 3 == 0) {
      const size_t pick = static_cast<size_t>(bits >> 8) % std::size(kHalf);
      switch (type) {
        case DataType::kFloat16:
          bits = kHalf[pick];
          break;
        case DataType::kBfloat16:
          bits = kBfloat[pick];
          break;
        case DataType::kFloat32:
          bits = kSingle[pick];
          break;
        case DataType::kFloat64:
          bits = kDouble[pick];
          break;
        default:
          break;  // integers: every bit pattern is already an edge case
      }
    }
    std::memcpy(bytes.data() + i * size, &bits, size);  // low bytes on x86 and aarch64
  }
  return bytes;
}

TEST(ReduceIsa, SelectedPathIsAvailableAndNamed) {
  using namespace reduce_internal;
  EXPECT_TRUE(reduceIsaAvailable(ReduceIsa::kPortable));
  EXPECT_TRUE(reduceIsaAvailable(reduceIsaSelected()));
  // The best path wins: nothing available ranks above the selected one.
  for (ReduceIsa isa : {ReduceIsa::kAvx2, ReduceIsa::kAvx512}) {
    if (reduceIsaAvailable(isa)) {
      EXPECT_GE(reduceIsaSelected(), isa);
    }
  }
  std::cout << "reduce path: " << reduceIsaName(reduceIsaSelected()) << "\n";
}

// Max and min keep a NaN on whichever side it is, on every path and for
// every floating type, as torch.maximum does: which operand is which is the
// algorithm's choice (a ring combines incoming with local, a tree local with
// incoming), and a NaN that only some orders kept would show on one host
// layout and vanish on another.
TEST(ReduceIsa, MaxAndMinKeepANaNOnEitherSide) {
  using namespace reduce_internal;
  constexpr size_t kCount = 40;  // whole vectors and a tail on every path
  for (ReduceIsa isa : {ReduceIsa::kPortable, ReduceIsa::kAvx2, ReduceIsa::kAvx512}) {
    if (!reduceIsaAvailable(isa)) continue;
    for (DataType type :
         {DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64})
      for (RedOp op : {RedOp::kMax, RedOp::kMin}) {
        SCOPED_TRACE(std::string(reduceIsaName(isa)) + " " + describe(type, op, kCount));
        const size_t size = dataTypeSize(type);
        // Elements alternate: NaN in a and one in b, then one in a and NaN in b.
        Bytes a(kCount * size), b(kCount * size);
        for (size_t i = 0; i < kCount; ++i) {
          const uint64_t nan = type == DataType::kFloat16    ? 0x7E00
                               : type == DataType::kBfloat16 ? 0x7FC0
                               : type == DataType::kFloat32  ? 0x7FC00000
                                                             : 0x7FF8000000000000;
          const uint64_t one = type == DataType::kFloat16    ? 0x3C00
                               : type == DataType::kBfloat16 ? 0x3F80
                               : type == DataType::kFloat32  ? 0x3F800000
                                                             : 0x3FF0000000000000;
          std::memcpy(a.data() + i * size, i % 2 ? &one : &nan, size);
          std::memcpy(b.data() + i * size, i % 2 ? &nan : &one, size);
        }
        Bytes out(kCount * size);
        reduceElementsWithIsa(isa, out.data(), a.data(), b.data(), kCount, type, op);
        for (size_t i = 0; i < kCount; ++i)
          EXPECT_TRUE(isNanElement(type, out.data() + i * size))
              << "element " << i << " (NaN in " << (i % 2 ? "b" : "a")
              << "): " << hex(out.data() + i * size, size);
      }
  }
}

TEST(ReduceIsa, EveryPathMatchesPortableBitForBit) {
  using namespace reduce_internal;
  std::vector<ReduceIsa> paths;
  for (ReduceIsa isa : {ReduceIsa::kAvx2, ReduceIsa::kAvx512})
    if (reduceIsaAvailable(isa)) paths.push_back(isa);
  if (paths.empty()) GTEST_SKIP() << "only the portable path exists on this CPU";

  std::mt19937_64 rng(99);
  constexpr size_t kLengths[] = {0, 1, 15, 16, 17, 31, 33, 1000, 4099};
  for (ReduceIsa isa : paths) {
    for (DataType type : kAllTypes) {
      for (RedOp op : kAllOps) {
        for (size_t count : kLengths) {
          // An odd element offset makes every vector access unaligned.
          for (size_t offset : {size_t{0}, size_t{1}}) {
            SCOPED_TRACE(std::string(reduceIsaName(isa)) + " " + describe(type, op, count) +
                         " offset=" + std::to_string(offset));
            const size_t size = dataTypeSize(type);
            const size_t bytes = count * size, skip = offset * size;
            const Bytes a = edgeOperand(type, count + offset, rng);
            const Bytes b = edgeOperand(type, count + offset, rng);
            Bytes expected(bytes + skip);
            reduceElementsWithIsa(ReduceIsa::kPortable, expected.data() + skip, a.data() + skip,
                                  b.data() + skip, count, type, op);

            // Guard bytes on both sides catch writes outside [0, count).
            Bytes out(bytes + skip + 64, 0xA5);
            reduceElementsWithIsa(isa, out.data() + skip, a.data() + skip, b.data() + skip, count,
                                  type, op);
            Bytes intoA = a;
            reduceElementsWithIsa(isa, intoA.data() + skip, intoA.data() + skip, b.data() + skip,
                                  count, type, op);
            Bytes intoB = b;
            reduceElementsWithIsa(isa, intoB.data() + skip, a.data() + skip, intoB.data() + skip,
                                  count, type, op);

            const bool arithmetic = op != RedOp::kMax && op != RedOp::kMin;
            auto differs = [&](const uint8_t* got, size_t i) {
              const size_t at = skip + i * size;
              if (arithmetic && isNanElement(type, a.data() + at) &&
                  isNanElement(type, b.data() + at))
                return !isNanElement(type, got + i * size);
              return std::memcmp(expected.data() + at, got + i * size, size) != 0;
            };
            auto same = [&](const uint8_t* got) {
              for (size_t i = 0; i < count; ++i)
                if (differs(got, i)) return false;
              return true;
            };
            auto firstDifference = [&](const uint8_t* got) {
              for (size_t i = 0; i < count; ++i) {
                if (differs(got, i))
                  return "element " + std::to_string(i) +
                         ": a=" + hex(a.data() + skip + i * size, size) +
                         " b=" + hex(b.data() + skip + i * size, size) +
                         " portable=" + hex(expected.data() + skip + i * size, size) +
                         " path=" + hex(got + i * size, size);
              }
              return std::string("none");
            };
            EXPECT_TRUE(same(out.data() + skip)) << firstDifference(out.data() + skip);
            EXPECT_TRUE(same(intoA.data() + skip))
                << "dst == a, " << firstDifference(intoA.data() + skip);
            EXPECT_TRUE(same(intoB.data() + skip))
                << "dst == b, " << firstDifference(intoB.data() + skip);
            EXPECT_TRUE(std::all_of(out.begin(), out.begin() + static_cast<ptrdiff_t>(skip),
                                    [](uint8_t v) { return v == 0xA5; }))
                << "wrote before dst";
            EXPECT_TRUE(std::all_of(out.begin() + static_cast<ptrdiff_t>(skip + bytes), out.end(),
                                    [](uint8_t v) { return v == 0xA5; }))
                << "wrote past count";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace braid
