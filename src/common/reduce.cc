// Host reduction kernels. They sit on the critical path of every reducing
// collective, so each (type, op) pair gets its own plain loop, chosen once per
// call, that GCC vectorizes at -O3 without intrinsics or -march flags: the CI
// and user machines are baseline x86-64 or aarch64, and F16C may be missing.
//
// Why widening fp16/bf16 to fp32 gives correctly rounded results: rounding the
// exact result first to p' bits and then to p bits equals rounding it once to
// p bits when p' >= 2p + 2 (Figueroa, "When is double rounding innocuous?").
// fp32 has p' = 24; fp16 has p = 11 and bf16 p = 8, so sums, products and the
// division of applyAverage match a native implementation bit for bit.
//
// The fp16 conversions use only integer and fp32 operations that SSE2 and
// NEON vectorize: the scale-and-add method of Marat Dukhan's FP16 library
// (MIT), which lets the FPU do the round-to-nearest-even for us. It assumes
// the default rounding mode, which braid never changes.
#include "src/common/reduce.h"

#include <bit>
#include <cassert>
#include <cstring>
#include <type_traits>

namespace braid {
namespace {

// ---- Scalar conversions, inline so the loops below vectorize them ----
//
// They take and return 16-bit values in the low half of a uint32_t: the
// vector loops then stay in 32-bit lanes throughout (see reduceNarrow).

// A select by masks. With a ternary GCC sinks the fp32 arithmetic into the
// branch that uses it and then, because fp operations may trap
// (-ftrapping-math, the default), will not if-convert it back: the loop keeps
// a branch and does not vectorize.
inline uint32_t selectBits(bool condition, uint32_t ifTrue, uint32_t ifFalse) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (ifTrue & mask) | (ifFalse & ~mask);
}

inline float halfToFloatInline(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t magnitude = h & 0x7FFFu;  // exponent and mantissa
  // Normal, Inf and NaN: exponent and mantissa move into fp32 position with
  // the exponent 224 rather than 112 too high, so that half exponent 31 lands
  // on fp32 255 (Inf/NaN); the multiply takes the surplus away.
  const float normal = std::bit_cast<float>((magnitude << 13) + (0xE0u << 23)) * 0x1p-112f;
  // Subnormal: m * 2^-24 = (0.5 + m * 2^-24) - 0.5, both steps exact, and no
  // fp32 subnormal involved, so flush-to-zero modes cannot touch it.
  const float subnormal = std::bit_cast<float>(magnitude | (126u << 23)) - 0.5f;
  const uint32_t bits = selectBits(magnitude < 0x0400u, std::bit_cast<uint32_t>(subnormal),
                                   std::bit_cast<uint32_t>(normal));
  return std::bit_cast<float>(sign | bits);
}

inline uint32_t floatToHalfInline(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t absBits = bits & 0x7FFFFFFFu;
  // |f| * 2^112 overflows to Inf exactly for |f| >= 2^16, so every value that
  // rounds to half Inf does; the second factor leaves 4|f| for the rest.
  const float scaled = std::bit_cast<float>(absBits) * 0x1p112f * 0x1p-110f;
  // Adding 2^(e + 15), e being f's exponent but at least -14 (the smallest
  // normal half exponent), leaves exactly 10 bits of 4|f| below its leading
  // one, and the FPU rounds the rest away to nearest-even. Subnormal halves
  // fall out of the clamp: their spacing is that of exponent -14.
  const float exponentScaled = std::bit_cast<float>(absBits & 0x7F800000u) * 0x1p15f;
  const float bias = exponentScaled < 0x1p1f ? 0x1p1f : exponentScaled;
  const uint32_t rounded = std::bit_cast<uint32_t>(bias + scaled);
  // The sum's low exponent bits are e + 14 (mod 32) and its low 12 bits the
  // rounded mantissa with the leading one, which adds the missing 1 to the
  // exponent, or 2 when rounding carried out of the mantissa.
  const uint32_t exponentBits = (rounded >> 13) & 0x7C00u;
  const uint32_t mantissaBits = rounded & 0x0FFFu;
  const bool isNan = absBits > 0x7F800000u;
  const uint32_t result = selectBits(isNan, 0x7E00u, exponentBits + mantissaBits);
  return ((bits >> 16) & 0x8000u) | result;
}

inline float bfloat16ToFloatInline(uint32_t b) {
  return std::bit_cast<float>(b << 16);
}

inline uint32_t floatToBfloat16Inline(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  // Round to nearest-even on the dropped half; a carry walks into the exponent
  // and, past the largest finite value, into Inf, as it should.
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  const bool isNan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  // A NaN whose payload lies in the dropped half would become Inf; keep it a
  // NaN by setting the quiet bit.
  return selectBits(isNan, (bits >> 16) | 0x0040u, rounded >> 16);
}

struct HalfFormat {
  static float widen(uint32_t v) { return halfToFloatInline(v); }
  static uint32_t narrow(float v) { return floatToHalfInline(v); }
};
struct Bfloat16Format {
  static float widen(uint32_t v) { return bfloat16ToFloatInline(v); }
  static uint32_t narrow(float v) { return floatToBfloat16Inline(v); }
};

// ---- Element-wise operations ----

template <RedOp kOp, typename T>
inline T combine(T a, T b) {
  if constexpr (kOp == RedOp::kSum || kOp == RedOp::kProd) {
    if constexpr (std::is_integral_v<T>) {
      // Signed overflow is UB; unsigned arithmetic of at least int width wraps
      // and C++20 defines the conversion back as modular.
      using Wide = std::common_type_t<std::make_unsigned_t<T>, unsigned>;
      const Wide x = static_cast<Wide>(a), y = static_cast<Wide>(b);
      return static_cast<T>(kOp == RedOp::kSum ? x + y : x * y);
    } else {
      return kOp == RedOp::kSum ? a + b : a * b;
    }
  } else if constexpr (kOp == RedOp::kMax) {
    // GCC emits SSE maxps/minps for these two forms (whose NaN and signed
    // zero behaviour they share), so floats vectorize without -ffast-math.
    return a < b ? b : a;
  } else {
    static_assert(kOp == RedOp::kMin);
    return b < a ? b : a;
  }
}

// The compiler versions this loop on a runtime overlap check; dst equal to a
// or b takes the vector path too because each element is read before it is
// written at the same index.
template <RedOp kOp, typename T>
void reduceNative(void* dst, const void* a, const void* b, size_t count) {
  T* out = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < count; ++i) out[i] = combine<kOp>(x[i], y[i]);
}

// fp16/bf16 elements are handled in pairs, one 32-bit word at a time: the
// low and high halves are two independent elements, each widened, combined
// and narrowed in its own 32-bit lane, and shifted back into place. Without
// this, SSE2 (no 32-to-16-bit truncating pack) spends most of the loop on
// shuffles. Which half holds the earlier element depends on endianness, but
// the load and the store agree, so the result does not.
inline uint32_t loadPair(const uint16_t* p) {
  uint32_t word;
  std::memcpy(&word, p, sizeof word);
  return word;
}
inline void storePair(uint16_t* p, uint32_t word) {
  std::memcpy(p, &word, sizeof word);
}

template <RedOp kOp, typename Format>
inline uint32_t combinePair(uint32_t x, uint32_t y) {
  const uint32_t low =
      Format::narrow(combine<kOp>(Format::widen(x & 0xFFFFu), Format::widen(y & 0xFFFFu)));
  const uint32_t high =
      Format::narrow(combine<kOp>(Format::widen(x >> 16), Format::widen(y >> 16)));
  return low | (high << 16);
}

template <RedOp kOp, typename Format>
void reduceNarrow(void* dst, const void* a, const void* b, size_t count) {
  uint16_t* out = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  const size_t pairs = count / 2;
  for (size_t i = 0; i < pairs; ++i)
    storePair(out + 2 * i, combinePair<kOp, Format>(loadPair(x + 2 * i), loadPair(y + 2 * i)));
  if (count % 2) {
    const size_t last = count - 1;
    out[last] = static_cast<uint16_t>(
        Format::narrow(combine<kOp>(Format::widen(x[last]), Format::widen(y[last]))));
  }
}

template <RedOp kOp>
void reduceForOp(void* dst, const void* a, const void* b, size_t count, DataType type) {
  switch (type) {
    case DataType::kInt8:
      return reduceNative<kOp, int8_t>(dst, a, b, count);
    case DataType::kUint8:
      return reduceNative<kOp, uint8_t>(dst, a, b, count);
    case DataType::kInt32:
      return reduceNative<kOp, int32_t>(dst, a, b, count);
    case DataType::kUint32:
      return reduceNative<kOp, uint32_t>(dst, a, b, count);
    case DataType::kInt64:
      return reduceNative<kOp, int64_t>(dst, a, b, count);
    case DataType::kUint64:
      return reduceNative<kOp, uint64_t>(dst, a, b, count);
    case DataType::kFloat16:
      return reduceNarrow<kOp, HalfFormat>(dst, a, b, count);
    case DataType::kBfloat16:
      return reduceNarrow<kOp, Bfloat16Format>(dst, a, b, count);
    case DataType::kFloat32:
      return reduceNative<kOp, float>(dst, a, b, count);
    case DataType::kFloat64:
      return reduceNative<kOp, double>(dst, a, b, count);
  }
}

// ---- Averaging ----

template <typename T>
void divideNative(void* data, size_t count, int divisor) {
  T* values = static_cast<T*>(data);
  if constexpr (std::is_integral_v<T> && sizeof(T) <= 4) {
    // x86 and NEON have no vector integer division. For |x| < 2^32 the double
    // quotient is at least 1/|x| away from the next integer, far more than its
    // rounding error, so truncating it equals C's integer division exactly.
    const double d = divisor;
    for (size_t i = 0; i < count; ++i)
      values[i] = static_cast<T>(static_cast<double>(values[i]) / d);
  } else {
    const T d = static_cast<T>(divisor);
    for (size_t i = 0; i < count; ++i) values[i] /= d;
  }
}

template <typename Format>
void divideNarrow(void* data, size_t count, int divisor) {
  uint16_t* values = static_cast<uint16_t*>(data);
  const float d = static_cast<float>(divisor);
  auto divide = [d](uint32_t v) { return Format::narrow(Format::widen(v) / d); };
  for (size_t i = 0; i < count / 2; ++i) {
    const uint32_t word = loadPair(values + 2 * i);
    storePair(values + 2 * i, divide(word & 0xFFFFu) | (divide(word >> 16) << 16));
  }
  if (count % 2) values[count - 1] = static_cast<uint16_t>(divide(values[count - 1]));
}

}  // namespace

void reduceElements(void* dst, const void* a, const void* b, size_t count, DataType type,
                    RedOp op) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      return reduceForOp<RedOp::kSum>(dst, a, b, count, type);
    case RedOp::kProd:
      return reduceForOp<RedOp::kProd>(dst, a, b, count, type);
    case RedOp::kMax:
      return reduceForOp<RedOp::kMax>(dst, a, b, count, type);
    case RedOp::kMin:
      return reduceForOp<RedOp::kMin>(dst, a, b, count, type);
  }
}

void applyAverage(void* data, size_t count, DataType type, int divisor) {
  // The divisor is a rank count. Dividing by 1 changes nothing, and a
  // divisor below 1 is a caller bug that must not turn into undefined
  // behaviour (INT_MIN / -1, a double out of an integer's range) here.
  assert(divisor >= 1);
  if (divisor <= 1) return;
  switch (type) {
    case DataType::kInt8:
      return divideNative<int8_t>(data, count, divisor);
    case DataType::kUint8:
      return divideNative<uint8_t>(data, count, divisor);
    case DataType::kInt32:
      return divideNative<int32_t>(data, count, divisor);
    case DataType::kUint32:
      return divideNative<uint32_t>(data, count, divisor);
    case DataType::kInt64:
      return divideNative<int64_t>(data, count, divisor);
    case DataType::kUint64:
      return divideNative<uint64_t>(data, count, divisor);
    case DataType::kFloat16:
      return divideNarrow<HalfFormat>(data, count, divisor);
    case DataType::kBfloat16:
      return divideNarrow<Bfloat16Format>(data, count, divisor);
    case DataType::kFloat32:
      return divideNative<float>(data, count, divisor);
    case DataType::kFloat64:
      return divideNative<double>(data, count, divisor);
  }
}

float halfToFloat(uint16_t h) {
  return halfToFloatInline(h);
}
uint16_t floatToHalf(float f) {
  return static_cast<uint16_t>(floatToHalfInline(f));
}
float bfloat16ToFloat(uint16_t b) {
  return bfloat16ToFloatInline(b);
}
uint16_t floatToBfloat16(float f) {
  return static_cast<uint16_t>(floatToBfloat16Inline(f));
}

}  // namespace braid
