// Expected values for the multi-process collective tests.
//
// Every rank can generate every other rank's input from (seed, rank, index),
// so each rank computes the exact expected result of a collective serially
// and compares it with what braid produced. Inputs are chosen so that every
// result is exact in its type:
//  - integers: Sum, Prod, Max and Min use values over the type's whole range;
//    Sum and Prod wrap in the type's width (modular arithmetic is exact and
//    independent of the order of the reduction). Avg uses small values so
//    the sum never wraps, and truncates toward zero.
//  - floats: integers (Sum, Max, Min) small enough that every partial sum is
//    representable, and powers of two (Prod) whose products stay exact, so
//    the order and fp32 accumulation of fp16/bf16 do not matter. Avg is the
//    only inexact result and is compared with a tolerance derived from the
//    type's epsilon.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "braid.h"

namespace braidtest {

inline constexpr braidDataType_t kAllTypes[] = {
    braidInt8,   braidUint8,   braidInt32,    braidUint32,  braidInt64,
    braidUint64, braidFloat16, braidBfloat16, braidFloat32, braidFloat64};
inline constexpr braidRedOp_t kAllOps[] = {braidSum, braidProd, braidMax, braidMin, braidAvg};

struct TypeInfo {
  const char* name;
  size_t size;
  bool isFloat;
  bool isSigned;
  double eps;  // unit roundoff of float types, 0 for integers
};

inline TypeInfo typeInfo(braidDataType_t t) {
  switch (t) {
    case braidInt8:
      return {"int8", 1, false, true, 0};
    case braidUint8:
      return {"uint8", 1, false, false, 0};
    case braidInt32:
      return {"int32", 4, false, true, 0};
    case braidUint32:
      return {"uint32", 4, false, false, 0};
    case braidInt64:
      return {"int64", 8, false, true, 0};
    case braidUint64:
      return {"uint64", 8, false, false, 0};
    case braidFloat16:
      return {"float16", 2, true, true, std::ldexp(1.0, -11)};
    case braidBfloat16:
      return {"bfloat16", 2, true, true, std::ldexp(1.0, -8)};
    case braidFloat32:
      return {"float32", 4, true, true, std::ldexp(1.0, -24)};
    case braidFloat64:
      return {"float64", 8, true, true, std::ldexp(1.0, -53)};
    default:
      return {"?", 1, false, false, 0};
  }
}

inline const char* opName(braidRedOp_t op) {
  switch (op) {
    case braidSum:
      return "sum";
    case braidProd:
      return "prod";
    case braidMax:
      return "max";
    case braidMin:
      return "min";
    case braidAvg:
      return "avg";
    default:
      return "?";
  }
}

// ---- fp16 / bf16 ----------------------------------------------------------

inline float halfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  if (exp == 0x1f) {
    uint32_t bits = sign | 0x7f800000u | (man << 13);
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
                       : std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  return sign ? -mag : mag;
}

// Round to nearest even; the tests only convert values the type represents.
inline uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (absx < 0x38800000u) {                                               // subnormal or zero
    float a;
    std::memcpy(&a, &absx, 4);
    float scaled = a * 16777216.0f;  // 2^24: exact, then round to integer (RNE)
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  uint32_t mant = absx & 0x7fffffu;
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// ---- Elements ---------------------------------------------------------------

// One element: integers as 64-bit two's complement, sign- or zero-extended
// from the type's width; floats as a double.
struct Num {
  uint64_t u = 0;
  double d = 0;
};

// Wraps an integer to the type's width and extends it back to 64 bits.
inline uint64_t wrapInt(braidDataType_t t, uint64_t v) {
  TypeInfo ti = typeInfo(t);
  if (ti.size == 8) return v;
  unsigned bits = static_cast<unsigned>(ti.size * 8);
  uint64_t mask = (uint64_t{1} << bits) - 1;
  v &= mask;
  if (ti.isSigned && (v >> (bits - 1))) v |= ~mask;
  return v;
}

inline void storeNum(braidDataType_t t, void* buf, size_t i, Num n) {
  TypeInfo ti = typeInfo(t);
  unsigned char* p = static_cast<unsigned char*>(buf) + i * ti.size;
  if (!ti.isFloat) {
    std::memcpy(p, &n.u, ti.size);  // little endian: the low bytes
    return;
  }
  if (t == braidFloat16) {
    uint16_t h = floatToHalf(static_cast<float>(n.d));
    std::memcpy(p, &h, 2);
  } else if (t == braidBfloat16) {
    uint16_t b = floatToBf16(static_cast<float>(n.d));
    std::memcpy(p, &b, 2);
  } else if (t == braidFloat32) {
    float f = static_cast<float>(n.d);
    std::memcpy(p, &f, 4);
  } else {
    std::memcpy(p, &n.d, 8);
  }
}

inline Num loadNum(braidDataType_t t, const void* buf, size_t i) {
  TypeInfo ti = typeInfo(t);
  const unsigned char* p = static_cast<const unsigned char*>(buf) + i * ti.size;
  Num n;
  if (!ti.isFloat) {
    std::memcpy(&n.u, p, ti.size);
    n.u = wrapInt(t, n.u);
  } else if (t == braidFloat16 || t == braidBfloat16) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    n.d = t == braidFloat16 ? halfToFloat(h) : bf16ToFloat(h);
  } else if (t == braidFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    n.d = f;
  } else {
    std::memcpy(&n.d, p, 8);
  }
  return n;
}

inline std::string numToString(braidDataType_t t, Num n) {
  char buf[64];
  TypeInfo ti = typeInfo(t);
  if (ti.isFloat)
    std::snprintf(buf, sizeof buf, "%.9g", n.d);
  else if (ti.isSigned)
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n.u));
  else
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n.u));
  return buf;
}

// ---- Inputs -----------------------------------------------------------------

// What an input is used for decides its range (see the top of this file).
// Copy is for collectives that only move data: values spread widely so that a
// misplaced element shows.
enum class Kind { kCopy, kSum, kProd, kMaxMin, kAvg };

inline Kind kindOf(braidRedOp_t op) {
  switch (op) {
    case braidSum:
      return Kind::kSum;
    case braidProd:
      return Kind::kProd;
    case braidAvg:
      return Kind::kAvg;
    default:
      return Kind::kMaxMin;
  }
}

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform integer in [-m, m].
inline int64_t symmetric(uint64_t h, int64_t m) {
  return static_cast<int64_t>(h % static_cast<uint64_t>(2 * m + 1)) - m;
}

// Input of `rank` at `index` for case `seed`.
inline Num inputValue(braidDataType_t t, Kind kind, uint64_t seed, int rank, size_t index) {
  uint64_t h = mix64(seed * 0x100000001b3ull ^ mix64(static_cast<uint64_t>(rank) << 40 ^ index));
  TypeInfo ti = typeInfo(t);
  Num n;
  if (!ti.isFloat) {
    if (kind == Kind::kAvg) {
      // Small enough that the sum of 8 ranks never wraps.
      int64_t m = ti.size == 1 ? 15 : 1000;
      int64_t v = ti.isSigned ? symmetric(h, m) : static_cast<int64_t>(h % (2 * m + 1));
      n.u = static_cast<uint64_t>(v);
    } else if (kind == Kind::kProd) {
      n.u = wrapInt(t, h | 1u);  // odd: the wrapped product never collapses to 0
    } else {
      n.u = wrapInt(t, h);
    }
    return n;
  }
  // Largest magnitude whose sums over 8 ranks stay exact: fp16 integers up to
  // 2048, bf16 up to 256.
  int64_t m = t == braidFloat16    ? 64
              : t == braidBfloat16 ? 32
              : t == braidFloat32  ? 65536
                                   : (int64_t{1} << 40);
  switch (kind) {
    case Kind::kProd: {
      static constexpr double kPow2[] = {-2.0, -1.0, -0.5, 0.5, 1.0, 2.0};
      n.d = kPow2[h % 6];
      break;
    }
    case Kind::kCopy:
    case Kind::kMaxMin:
      // Halves too: exact in every float type at these magnitudes.
      n.d = static_cast<double>(symmetric(h, 2 * m)) / 2.0;
      if (t == braidBfloat16) n.d = static_cast<double>(symmetric(h, 127));
      break;
    default:
      n.d = static_cast<double>(symmetric(h, m));
      break;
  }
  return n;
}

inline void fillInput(braidDataType_t t, Kind kind, uint64_t seed, int rank, void* buf,
                      size_t count, size_t firstIndex = 0) {
  for (size_t i = 0; i < count; ++i)
    storeNum(t, buf, i, inputValue(t, kind, seed, rank, firstIndex + i));
}

// ---- Reduction ----------------------------------------------------------------

// Expected element plus the tolerance it is compared with (0 = exact).
struct Expected {
  Num value;
  double tol = 0;
};

// op over ranks 0..n-1 of inputValue(rank, index).
inline Expected reduceAt(braidDataType_t t, braidRedOp_t op, uint64_t seed, int n, size_t index) {
  TypeInfo ti = typeInfo(t);
  Kind kind = kindOf(op);
  Expected e;
  Num first = inputValue(t, kind, seed, 0, index);
  uint64_t u = first.u;
  double d = first.d, absSum = std::fabs(first.d);
  for (int r = 1; r < n; ++r) {
    Num x = inputValue(t, kind, seed, r, index);
    switch (op) {
      case braidSum:
      case braidAvg:
        u += x.u;
        d += x.d;
        break;
      case braidProd:
        u *= x.u;
        d *= x.d;
        break;
      case braidMax:
        if (ti.isSigned ? static_cast<int64_t>(x.u) > static_cast<int64_t>(u) : x.u > u) u = x.u;
        d = std::fmax(d, x.d);
        break;
      default:
        if (ti.isSigned ? static_cast<int64_t>(x.u) < static_cast<int64_t>(u) : x.u < u) u = x.u;
        d = std::fmin(d, x.d);
        break;
    }
    absSum += std::fabs(x.d);
  }
  u = wrapInt(t, u);
  if (op == braidAvg) {
    if (ti.isFloat) {
      d /= n;
      // n roundings of terms of at most absSum/n, plus the final rounding.
      e.tol = (n + 2) * ti.eps * (absSum / n) + ti.eps * std::fabs(d);
    } else if (ti.isSigned) {
      u = wrapInt(t, static_cast<uint64_t>(static_cast<int64_t>(u) / n));
    } else {
      u = wrapInt(t, u / static_cast<uint64_t>(n));
    }
  }
  e.value.u = ti.isFloat ? 0 : u;
  e.value.d = ti.isFloat ? d : 0;
  return e;
}

// Compares got[0..count) with expect(i); returns "" or a description of the
// first mismatch and the number of mismatches.
template <typename ExpectFn>
std::string compareWith(braidDataType_t t, const void* got, size_t count, ExpectFn&& expect) {
  TypeInfo ti = typeInfo(t);
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < count; ++i) {
    Expected e = expect(i);
    Num g = loadNum(t, got, i);
    bool ok;
    if (!ti.isFloat)
      ok = g.u == e.value.u;
    else if (e.tol > 0)
      ok = std::fabs(g.d - e.value.d) <= e.tol;
    else
      ok = g.d == e.value.d;  // +0 == -0; NaN never matches
    if (!ok && bad++ == 0)
      first = "element " + std::to_string(i) + ": expected " + numToString(t, e.value) +
              (e.tol > 0 ? " (+-" + std::to_string(e.tol) + ")" : "") + ", got " +
              numToString(t, g);
  }
  if (bad == 0) return "";
  return first + " (" + std::to_string(bad) + " of " + std::to_string(count) + " elements wrong)";
}

// A buffer with guard bytes before and after it, to catch writes outside
// the range a call may touch. The data starts `shift` elements after an
// 8-byte boundary, so that calls also see buffers that are only element-aligned.
class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 64;
  GuardedBuffer(braidDataType_t t, size_t count, unsigned char fill = 0xcd, size_t shift = 0)
      : bytes_(count * typeInfo(t).size),
        shift_(shift * typeInfo(t).size),
        mem_(bytes_ + 2 * kGuard + 8 + shift_) {
    for (size_t i = 0; i < mem_.size(); ++i)
      mem_[i] = i >= offset() && i < offset() + bytes_ ? fill : guardByte(i);
  }
  void* data() { return mem_.data() + offset(); }
  unsigned char* bytes() { return mem_.data() + offset(); }
  size_t size() const { return bytes_; }
  bool guardsIntact() const {
    for (size_t i = 0; i < offset(); ++i)
      if (mem_[i] != guardByte(i)) return false;
    for (size_t i = offset() + bytes_; i < mem_.size(); ++i)
      if (mem_[i] != guardByte(i)) return false;
    return true;
  }
  std::vector<unsigned char> snapshot() { return {bytes(), bytes() + bytes_}; }
  bool equals(const std::vector<unsigned char>& s) {
    return s.size() == bytes_ && (bytes_ == 0 || std::memcmp(bytes(), s.data(), bytes_) == 0);
  }

 private:
  static unsigned char guardByte(size_t i) { return static_cast<unsigned char>(0xa5 ^ (i * 31)); }
  size_t offset() const {
    auto base = reinterpret_cast<uintptr_t>(mem_.data());
    return kGuard + ((8 - base % 8) % 8) + shift_;
  }
  size_t bytes_, shift_;
  std::vector<unsigned char> mem_;
};

}  // namespace braidtest
