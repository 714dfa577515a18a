// Host reduction kernels. They sit on the critical path of every reducing
// collective, so each (type, op) pair gets its own loop, looked up once per
// call in a table of function pointers.
//
// The table comes in up to three builds of the same arithmetic, chosen once
// per process from what the CPU reports: the portable one (plain loops that
// GCC vectorizes at baseline x86-64 SSE2 or on aarch64 NEON), and on x86 an
// AVX2+F16C and an AVX-512 (F/BW/VL/DQ) one. The library is compiled for
// baseline x86-64, because CI and user machines may lack AVX2; the wider
// builds are per-function target attributes, so no -march flag leaks into
// code that runs before the CPU check. The native-type loops and the bf16
// loop are the portable source inlined into those functions (hence the
// always_inline helpers), so every path computes the same operations in the
// same order; only fp16 uses intrinsics, because F16C converts a vector in one
// instruction where the portable bit tricks take about twenty.
//
// Why widening fp16/bf16 to fp32 gives correctly rounded results: rounding the
// exact result first to p' bits and then to p bits equals rounding it once to
// p bits when p' >= 2p + 2 (Figueroa, "When is double rounding innocuous?").
// fp32 has p' = 24; fp16 has p = 11 and bf16 p = 8, so sums, products and the
// division of applyAverage match a native implementation bit for bit.
//
// The portable arithmetic, conversions and loops, is in reduce_portable.h.
// F16C's conversions round to nearest-even like the portable ones (the
// immediate says so, whatever MXCSR holds) and are exact on the way up, so
// the paths differ only in NaN encodings, which the AVX kernels rewrite to
// the portable ones (see canonicalHalfNan).
#include "src/common/reduce.h"

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "src/common/reduce_portable.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define BRAID_REDUCE_X86 1
// GCC 12 reports its own _mm512_undefined_* idiom, inlined from these
// headers, as maybe-uninitialized (GCC bug 105593).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <cpuid.h>
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#define BRAID_REDUCE_X86 0
#endif

namespace braid {
namespace {

using reduce_portable::Bfloat16Format;
using reduce_portable::bfloat16ToFloatInline;
using reduce_portable::floatToBfloat16Inline;
using reduce_portable::floatToHalfInline;
using reduce_portable::HalfFormat;
using reduce_portable::halfToFloatInline;
using reduce_portable::loadPair;
using reduce_portable::reduceNarrow;
using reduce_portable::reduceNative;
using reduce_portable::storePair;

// ---- Kernels per instruction set ----
//
// Each set is a struct of static kernel templates with the same names, so one
// table builder serves all of them.

using Kernel = void (*)(void* dst, const void* a, const void* b, size_t count);

constexpr size_t kTypeCount = static_cast<size_t>(DataType::kFloat64) + 1;
// kAvg reduces as kSum, so it has no column of its own.
constexpr size_t kOpCount = static_cast<size_t>(RedOp::kMin) + 1;

struct KernelTable {
  Kernel entries[kTypeCount][kOpCount];
};

struct PortableKernels {
  template <RedOp kOp, typename T>
  static void native(void* dst, const void* a, const void* b, size_t count) {
    reduceNative<kOp, T>(dst, a, b, count);
  }
  template <RedOp kOp>
  static void half(void* dst, const void* a, const void* b, size_t count) {
    reduceNarrow<kOp, HalfFormat>(dst, a, b, count);
  }
  template <RedOp kOp>
  static void bfloat16(void* dst, const void* a, const void* b, size_t count) {
    reduceNarrow<kOp, Bfloat16Format>(dst, a, b, count);
  }
};

#if BRAID_REDUCE_X86

// FMA is left out on purpose: no kernel multiplies and adds, and with it GCC
// could contract the portable fp16 arithmetic differently on this path.
#define BRAID_TARGET_AVX2 __attribute__((target("avx2,f16c")))
// GCC's generic tuning would keep AVX-512 code at 256-bit vectors; these
// loops are long and streaming, where the full width pays on the CPUs that
// have it. DQ gives the 64-bit integer multiply.
#if defined(__clang__)
// Clang has no prefer-vector-width in target(); min_vector_width asks the
// same of its vectorizer.
#define BRAID_TARGET_AVX512 \
  __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512dq"), min_vector_width(512)))
#else
#define BRAID_TARGET_AVX512                                  \
  __attribute__((                                            \
      target("avx2,f16c,avx512f,avx512bw,avx512vl,avx512dq," \
             "prefer-vector-width=512")))
#endif

// The portable NaN from floatToHalfInline is the input's sign with 0x7E00;
// F16C keeps the top payload bits instead. Rewriting F16C's NaNs keeps the
// paths bit-identical, so a result never depends on which CPU computed it.
BRAID_TARGET_AVX2 BRAID_INLINE __m128i canonicalHalfNanAvx2(__m128i h) {
  const __m128i magnitude = _mm_and_si128(h, _mm_set1_epi16(0x7FFF));
  const __m128i isNan = _mm_cmpgt_epi16(magnitude, _mm_set1_epi16(0x7C00));
  const __m128i canonical = _mm_or_si128(
      _mm_and_si128(h, _mm_set1_epi16(static_cast<int16_t>(0x8000))), _mm_set1_epi16(0x7E00));
  return _mm_blendv_epi8(h, canonical, isNan);
}

// maxps/minps return their second operand when either is NaN or both are
// zero; with the operands swapped that is combine's select, and a blend
// keeps y where it is NaN, as combine's `|| b != b` does. Sums and products
// need no such care except when both operands are NaN: x86 then returns the
// first source, and GCC treats + and * as commutative and places the
// operands as register allocation likes, in the portable loops as much as
// here, so which NaN's sign survives is the compiler's choice on every path
// (IEEE 754 leaves it open too).
template <RedOp kOp>
BRAID_TARGET_AVX2 BRAID_INLINE __m256 combineAvx2(__m256 x, __m256 y) {
  if constexpr (kOp == RedOp::kSum) {
    return _mm256_add_ps(x, y);
  } else if constexpr (kOp == RedOp::kProd) {
    return _mm256_mul_ps(x, y);
  } else {
    const __m256 selected = kOp == RedOp::kMax ? _mm256_max_ps(y, x) : _mm256_min_ps(y, x);
    return _mm256_blendv_ps(selected, y, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
  }
}

// Eight fp16 elements. The immediate fixes round-to-nearest-even regardless
// of MXCSR.
template <RedOp kOp>
BRAID_TARGET_AVX2 BRAID_INLINE __m128i reduceHalf8Avx2(const uint16_t* x, const uint16_t* y) {
  const __m256 wx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  const __m256 wy = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y)));
  return canonicalHalfNanAvx2(_mm256_cvtps_ph(combineAvx2<kOp>(wx, wy), _MM_FROUND_TO_NEAREST_INT));
}

struct Avx2Kernels {
  template <RedOp kOp, typename T>
  BRAID_TARGET_AVX2 static void native(void* dst, const void* a, const void* b, size_t count) {
    reduceNative<kOp, T>(dst, a, b, count);
  }
  template <RedOp kOp>
  BRAID_TARGET_AVX2 static void bfloat16(void* dst, const void* a, const void* b, size_t count) {
    reduceNarrow<kOp, Bfloat16Format>(dst, a, b, count);
  }
  template <RedOp kOp>
  BRAID_TARGET_AVX2 static void half(void* dst, const void* a, const void* b, size_t count) {
    uint16_t* out = static_cast<uint16_t*>(dst);
    const uint16_t* x = static_cast<const uint16_t*>(a);
    const uint16_t* y = static_cast<const uint16_t*>(b);
    size_t i = 0;
    // Both halves are computed before either is stored, so dst == a or b is
    // safe: no element is written before it has been read.
    for (; i + 16 <= count; i += 16) {
      const __m128i low = reduceHalf8Avx2<kOp>(x + i, y + i);
      const __m128i high = reduceHalf8Avx2<kOp>(x + i + 8, y + i + 8);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), low);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 8), high);
    }
    for (; i + 8 <= count; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), reduceHalf8Avx2<kOp>(x + i, y + i));
    reduceNarrow<kOp, HalfFormat>(out + i, x + i, y + i, count - i);
  }
};

BRAID_TARGET_AVX512 BRAID_INLINE __m256i canonicalHalfNanAvx512(__m256i h) {
  const __mmask16 isNan = _mm256_cmpgt_epu16_mask(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
                                                  _mm256_set1_epi16(0x7C00));
  const __m256i canonical =
      _mm256_or_si256(_mm256_and_si256(h, _mm256_set1_epi16(static_cast<int16_t>(0x8000))),
                      _mm256_set1_epi16(0x7E00));
  return _mm256_mask_blend_epi16(isNan, h, canonical);
}

template <RedOp kOp>
BRAID_TARGET_AVX512 BRAID_INLINE __m512 combineAvx512(__m512 x, __m512 y) {
  if constexpr (kOp == RedOp::kSum) {
    return _mm512_add_ps(x, y);
  } else if constexpr (kOp == RedOp::kProd) {
    return _mm512_mul_ps(x, y);
  } else {
    const __m512 selected = kOp == RedOp::kMax ? _mm512_max_ps(y, x) : _mm512_min_ps(y, x);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), selected, y);
  }
}

// A lambda would not inherit the target attribute, hence a named helper.
BRAID_TARGET_AVX512 BRAID_INLINE __m256i load(const uint16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

template <RedOp kOp>
BRAID_TARGET_AVX512 BRAID_INLINE __m256i reduceHalf16Avx512(__m256i x, __m256i y) {
  const __m512 wide = combineAvx512<kOp>(_mm512_cvtph_ps(x), _mm512_cvtph_ps(y));
  return canonicalHalfNanAvx512(_mm512_cvtps_ph(wide, _MM_FROUND_TO_NEAREST_INT));
}

// bf16 narrowing as floatToBfloat16Inline does it, leaving the result in the
// high half of each 32-bit lane.
BRAID_TARGET_AVX512 BRAID_INLINE __m512i narrowBfloat16HighAvx512(__m512 value) {
  const __m512i bits = _mm512_castps_si512(value);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb);
  const __mmask16 isNan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  return _mm512_mask_blend_epi32(isNan, rounded,
                                 _mm512_or_si512(bits, _mm512_set1_epi32(0x00400000)));
}

// 32 bf16 elements, as reduceNarrow's pairs: the low and high 16 bits of each
// 32-bit lane are widened in place by a shift or a mask, so no shuffles. (The
// AVX512-BF16 conversion instruction is no use: it flushes subnormals.)
template <RedOp kOp>
BRAID_TARGET_AVX512 BRAID_INLINE __m512i reduceBfloat16x32Avx512(__m512i x, __m512i y) {
  const __m512i highMask = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  const __m512 lowResult = combineAvx512<kOp>(_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)),
                                              _mm512_castsi512_ps(_mm512_slli_epi32(y, 16)));
  const __m512 highResult = combineAvx512<kOp>(_mm512_castsi512_ps(_mm512_and_si512(x, highMask)),
                                               _mm512_castsi512_ps(_mm512_and_si512(y, highMask)));
  return _mm512_or_si512(_mm512_srli_epi32(narrowBfloat16HighAvx512(lowResult), 16),
                         _mm512_and_si512(narrowBfloat16HighAvx512(highResult), highMask));
}

struct Avx512Kernels {
  template <RedOp kOp, typename T>
  BRAID_TARGET_AVX512 static void native(void* dst, const void* a, const void* b, size_t count) {
    reduceNative<kOp, T>(dst, a, b, count);
  }
  template <RedOp kOp>
  BRAID_TARGET_AVX512 static void bfloat16(void* dst, const void* a, const void* b, size_t count) {
    uint16_t* out = static_cast<uint16_t*>(dst);
    const uint16_t* x = static_cast<const uint16_t*>(a);
    const uint16_t* y = static_cast<const uint16_t*>(b);
    size_t i = 0;
    for (; i + 32 <= count; i += 32)
      _mm512_storeu_si512(out + i, reduceBfloat16x32Avx512<kOp>(_mm512_loadu_si512(x + i),
                                                                _mm512_loadu_si512(y + i)));
    if (i < count) {
      const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (count - i)) - 1);
      const __m512i tail = reduceBfloat16x32Avx512<kOp>(_mm512_maskz_loadu_epi16(mask, x + i),
                                                        _mm512_maskz_loadu_epi16(mask, y + i));
      _mm512_mask_storeu_epi16(out + i, mask, tail);
    }
  }
  template <RedOp kOp>
  BRAID_TARGET_AVX512 static void half(void* dst, const void* a, const void* b, size_t count) {
    uint16_t* out = static_cast<uint16_t*>(dst);
    const uint16_t* x = static_cast<const uint16_t*>(a);
    const uint16_t* y = static_cast<const uint16_t*>(b);
    size_t i = 0;
    for (; i + 32 <= count; i += 32) {
      const __m256i low = reduceHalf16Avx512<kOp>(load(x + i), load(y + i));
      const __m256i high = reduceHalf16Avx512<kOp>(load(x + i + 16), load(y + i + 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), low);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16), high);
    }
    for (; i + 16 <= count; i += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          reduceHalf16Avx512<kOp>(load(x + i), load(y + i)));
    if (i < count) {
      // Masked loads do not fault on the lanes they leave out, so the tail
      // needs no scalar loop and never reads past the buffers.
      const __mmask16 mask = static_cast<__mmask16>((1u << (count - i)) - 1);
      const __m256i tail = reduceHalf16Avx512<kOp>(_mm256_maskz_loadu_epi16(mask, x + i),
                                                   _mm256_maskz_loadu_epi16(mask, y + i));
      _mm256_mask_storeu_epi16(out + i, mask, tail);
    }
  }
};

#endif  // BRAID_REDUCE_X86

template <typename Kernels, RedOp kOp>
constexpr void fillColumn(KernelTable& table) {
  constexpr size_t op = static_cast<size_t>(kOp);
  auto row = [](DataType type) { return static_cast<size_t>(type); };
  table.entries[row(DataType::kInt8)][op] = &Kernels::template native<kOp, int8_t>;
  table.entries[row(DataType::kUint8)][op] = &Kernels::template native<kOp, uint8_t>;
  table.entries[row(DataType::kInt32)][op] = &Kernels::template native<kOp, int32_t>;
  table.entries[row(DataType::kUint32)][op] = &Kernels::template native<kOp, uint32_t>;
  table.entries[row(DataType::kInt64)][op] = &Kernels::template native<kOp, int64_t>;
  table.entries[row(DataType::kUint64)][op] = &Kernels::template native<kOp, uint64_t>;
  table.entries[row(DataType::kFloat16)][op] = &Kernels::template half<kOp>;
  table.entries[row(DataType::kBfloat16)][op] = &Kernels::template bfloat16<kOp>;
  table.entries[row(DataType::kFloat32)][op] = &Kernels::template native<kOp, float>;
  table.entries[row(DataType::kFloat64)][op] = &Kernels::template native<kOp, double>;
}

template <typename Kernels>
constexpr KernelTable makeTable() {
  KernelTable table{};
  fillColumn<Kernels, RedOp::kSum>(table);
  fillColumn<Kernels, RedOp::kProd>(table);
  fillColumn<Kernels, RedOp::kMax>(table);
  fillColumn<Kernels, RedOp::kMin>(table);
  return table;
}

constexpr KernelTable kPortableTable = makeTable<PortableKernels>();
#if BRAID_REDUCE_X86
constexpr KernelTable kAvx2Table = makeTable<Avx2Kernels>();
constexpr KernelTable kAvx512Table = makeTable<Avx512Kernels>();
#endif

const KernelTable& tableFor(reduce_internal::ReduceIsa isa) {
  switch (isa) {
#if BRAID_REDUCE_X86
    case reduce_internal::ReduceIsa::kAvx2:
      return kAvx2Table;
    case reduce_internal::ReduceIsa::kAvx512:
      return kAvx512Table;
#endif
    default:
      return kPortableTable;
  }
}

void runKernel(const KernelTable& table, void* dst, const void* a, const void* b, size_t count,
               DataType type, RedOp op) {
  const size_t row = static_cast<size_t>(type);
  const size_t column = static_cast<size_t>(op == RedOp::kAvg ? RedOp::kSum : op);
  // An out-of-range enum value, which only a caller bug produces, does
  // nothing rather than jump through a wild pointer.
  if (row >= kTypeCount || column >= kOpCount) return;
  table.entries[row][column](dst, a, b, count);
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

namespace reduce_internal {

#if BRAID_REDUCE_X86
namespace {
// Clang 14's __builtin_cpu_supports does not know "f16c"; the CPUID bit is
// enough, since the AVX checks it goes with already cover the OS's YMM state.
bool cpuHasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
}  // namespace
#endif

bool reduceIsaAvailable(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::kPortable:
      return true;
#if BRAID_REDUCE_X86
    // __builtin_cpu_supports also checks that the OS saves the AVX and
    // AVX-512 register state (XCR0), not only the CPUID bits.
    case ReduceIsa::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && cpuHasF16c();
    case ReduceIsa::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             cpuHasF16c();
#endif
    default:
      return false;
  }
}

ReduceIsa reduceIsaSelected() {
  static const ReduceIsa selected = [] {
    for (ReduceIsa isa : {ReduceIsa::kAvx512, ReduceIsa::kAvx2})
      if (reduceIsaAvailable(isa)) return isa;
    return ReduceIsa::kPortable;
  }();
  return selected;
}

const char* reduceIsaName(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::kPortable:
      return "portable";
    case ReduceIsa::kAvx2:
      return "avx2";
    case ReduceIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

void reduceElementsWithIsa(ReduceIsa isa, void* dst, const void* a, const void* b, size_t count,
                           DataType type, RedOp op) {
  assert(reduceIsaAvailable(isa));
  runKernel(tableFor(isa), dst, a, b, count, type, op);
}

}  // namespace reduce_internal

void reduceElements(void* dst, const void* a, const void* b, size_t count, DataType type,
                    RedOp op) {
  static const KernelTable& table = tableFor(reduce_internal::reduceIsaSelected());
  runKernel(table, dst, a, b, count, type, op);
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
