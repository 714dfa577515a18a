// The portable arithmetic of the host reductions: scalar fp16/bf16
// conversions, the element-wise operations, and the loops over native and
// narrow (fp16/bf16) elements. It is separate from reduce.cc, which builds
// the kernels per instruction set from these loops and dispatches to them,
// because it is one self-contained idea: the arithmetic every path computes.
// It is a header, not a .cc, because every function here must inline into
// the target-attributed kernels of reduce.cc to be compiled for their
// instruction set (see BRAID_INLINE); include it only from the reduction
// kernels' own source files. The unnamed namespace keeps what reduce.cc had:
// internal linkage, with which GCC compiles the kernels to the same code (in
// a named namespace it orders some commutative operands differently).
//
// The portable fp16 conversions use only integer and fp32 operations that SSE2
// and NEON vectorize: the scale-and-add method of Marat Dukhan's FP16 library
// (MIT), which lets the FPU do the round-to-nearest-even for us. It assumes
// the default rounding mode, which braid never changes.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "src/common/datatype.h"

// Helpers of the kernels must inline into the target-attributed kernels to be
// compiled for the wider instruction set; GCC inlines a baseline function into
// an AVX one only when asked to when it judges the call too big.
#define BRAID_INLINE inline __attribute__((always_inline))

namespace braid::reduce_portable {
namespace {

// ---- Scalar conversions, inline so the loops below vectorize them ----
//
// They take and return 16-bit values in the low half of a uint32_t: the
// vector loops then stay in 32-bit lanes throughout (see reduceNarrow).

// A select by masks. With a ternary GCC sinks the fp32 arithmetic into the
// branch that uses it and then, because fp operations may trap
// (-ftrapping-math, the default), will not if-convert it back: the loop keeps
// a branch and does not vectorize.
BRAID_INLINE uint32_t selectBits(bool condition, uint32_t ifTrue, uint32_t ifFalse) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (ifTrue & mask) | (ifFalse & ~mask);
}

BRAID_INLINE float halfToFloatInline(uint32_t h) {
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

BRAID_INLINE uint32_t floatToHalfInline(float f) {
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

BRAID_INLINE float bfloat16ToFloatInline(uint32_t b) {
  return std::bit_cast<float>(b << 16);
}

BRAID_INLINE uint32_t floatToBfloat16Inline(float f) {
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
  BRAID_INLINE static float widen(uint32_t v) { return halfToFloatInline(v); }
  BRAID_INLINE static uint32_t narrow(float v) { return floatToHalfInline(v); }
};
struct Bfloat16Format {
  BRAID_INLINE static float widen(uint32_t v) { return bfloat16ToFloatInline(v); }
  BRAID_INLINE static uint32_t narrow(float v) { return floatToBfloat16Inline(v); }
};

// ---- Element-wise operations ----

template <RedOp kOp, typename T>
BRAID_INLINE T combine(T a, T b) {
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
  } else if constexpr (kOp == RedOp::kMax || kOp == RedOp::kMin) {
    // A NaN on either side is kept, as torch.maximum keeps it: which side is
    // which is the algorithm's choice, and a NaN kept on one side only would
    // come and go with the host layout. Otherwise maxps/minps's selects (b
    // where both are zeros), which GCC vectorizes without -ffast-math.
    const T selected = (kOp == RedOp::kMax ? a < b : b < a) ? b : a;
    if constexpr (std::is_floating_point_v<T>) return b != b ? b : selected;
    return selected;
  }
}

// The compiler versions this loop on a runtime overlap check; dst equal to a
// or b takes the vector path too because each element is read before it is
// written at the same index.
template <RedOp kOp, typename T>
BRAID_INLINE void reduceNative(void* dst, const void* a, const void* b, size_t count) {
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
BRAID_INLINE uint32_t loadPair(const uint16_t* p) {
  uint32_t word;
  std::memcpy(&word, p, sizeof word);
  return word;
}
BRAID_INLINE void storePair(uint16_t* p, uint32_t word) {
  std::memcpy(p, &word, sizeof word);
}

template <RedOp kOp, typename Format>
BRAID_INLINE uint32_t combinePair(uint32_t x, uint32_t y) {
  const uint32_t low =
      Format::narrow(combine<kOp>(Format::widen(x & 0xFFFFu), Format::widen(y & 0xFFFFu)));
  const uint32_t high =
      Format::narrow(combine<kOp>(Format::widen(x >> 16), Format::widen(y >> 16)));
  return low | (high << 16);
}

template <RedOp kOp, typename Format>
BRAID_INLINE void reduceNarrow(void* dst, const void* a, const void* b, size_t count) {
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

}  // namespace
}  // namespace braid::reduce_portable
