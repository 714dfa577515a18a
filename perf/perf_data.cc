// Test data of the perf drivers: inputs whose reductions are exact in every
// datatype, and the count of wrong result elements (see perf_driver.h).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "perf_driver.h"

namespace braid::perf {
namespace {

// --- Element encoding ---------------------------------------------------------

// Exact for the small integers the tests use (|v| < 65536).
uint16_t halfFromInt(int64_t value) {
  if (value == 0) return 0;
  uint16_t sign = value < 0 ? 0x8000 : 0;
  uint64_t magnitude = static_cast<uint64_t>(value < 0 ? -value : value);
  int exponent = std::bit_width(magnitude) - 1;
  if (exponent > 15) return sign | 0x7c00;  // infinity
  uint64_t mantissa = exponent <= 10 ? magnitude << (10 - exponent) : magnitude >> (exponent - 10);
  return static_cast<uint16_t>(sign | ((exponent + 15) << 10) | (mantissa & 0x3ff));
}

double halfToDouble(uint16_t bits) {
  int exponent = (bits >> 10) & 0x1f;
  double mantissa = bits & 0x3ff;
  double magnitude = exponent == 0    ? std::ldexp(mantissa, -24)
                     : exponent == 31 ? (mantissa == 0 ? INFINITY : NAN)
                                      : std::ldexp(mantissa + 1024, exponent - 25);
  return (bits & 0x8000) ? -magnitude : magnitude;
}

void storeInt(const DataType& type, void* buffer, size_t i, int64_t value) {
  switch (type.type) {
    case braidInt8:
      static_cast<int8_t*>(buffer)[i] = static_cast<int8_t>(value);
      break;
    case braidUint8:
      static_cast<uint8_t*>(buffer)[i] = static_cast<uint8_t>(value);
      break;
    case braidInt32:
      static_cast<int32_t*>(buffer)[i] = static_cast<int32_t>(value);
      break;
    case braidUint32:
      static_cast<uint32_t*>(buffer)[i] = static_cast<uint32_t>(value);
      break;
    case braidInt64:
      static_cast<int64_t*>(buffer)[i] = value;
      break;
    case braidUint64:
      static_cast<uint64_t*>(buffer)[i] = static_cast<uint64_t>(value);
      break;
    case braidFloat16:
      static_cast<uint16_t*>(buffer)[i] = halfFromInt(value);
      break;
    case braidBfloat16:  // bfloat16 is the top half of a float
      static_cast<uint16_t*>(buffer)[i] =
          static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(value)) >> 16);
      break;
    case braidFloat32:
      static_cast<float*>(buffer)[i] = static_cast<float>(value);
      break;
    default:
      static_cast<double*>(buffer)[i] = static_cast<double>(value);
      break;
  }
}

int64_t loadInt(const DataType& type, const void* buffer, size_t i) {
  switch (type.type) {
    case braidInt8:
      return static_cast<const int8_t*>(buffer)[i];
    case braidUint8:
      return static_cast<const uint8_t*>(buffer)[i];
    case braidInt32:
      return static_cast<const int32_t*>(buffer)[i];
    case braidUint32:
      return static_cast<const uint32_t*>(buffer)[i];
    case braidInt64:
      return static_cast<const int64_t*>(buffer)[i];
    default:
      return static_cast<int64_t>(static_cast<const uint64_t*>(buffer)[i]);
  }
}

double loadReal(const DataType& type, const void* buffer, size_t i) {
  switch (type.type) {
    case braidFloat16:
      return halfToDouble(static_cast<const uint16_t*>(buffer)[i]);
    case braidBfloat16:
      return std::bit_cast<float>(uint32_t{static_cast<const uint16_t*>(buffer)[i]} << 16);
    case braidFloat32:
      return static_cast<const float*>(buffer)[i];
    default:
      return static_cast<const double*>(buffer)[i];
  }
}

// Largest input magnitude: small enough that a sum over all ranks stays exact
// (and for integer avg, unwrapped); at most 5, as larger gains nothing.
int64_t inputAmplitude(const TestContext& ctx) {
  return static_cast<int64_t>(std::clamp(ctx.type->maxExactInt / ctx.nranks, 1.0, 5.0));
}

// How many kinds of element there are: an element's inputs on every rank
// depend on its kind alone, so that a check tabulates one result per kind.
size_t inputKinds(const TestContext& ctx) {
  if (ctx.op == braidProd) return 8;  // the sign (or factor) patterns of three ranks
  int64_t amplitude = inputAmplitude(ctx);
  return static_cast<size_t>(ctx.type->isSigned ? 2 * amplitude + 1 : amplitude + 1);
}

// The kind of element `index`: a hash of the index (two multiplies and a
// shift, cheap enough for filling gigabytes), which has no period, so that
// two blocks of a reduction's result differ wherever they are cut (a block
// delivered to the wrong rank reads wrong). Fibonacci hashing alone was not
// enough: blocks a multiple of 48 apart fell on the same kinds.
size_t inputKind(const TestContext& ctx, size_t index) {
  uint64_t x = static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ULL;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  return static_cast<size_t>((x >> 32) % inputKinds(ctx));
}

// The input of `rank` in elements of `kind`.
int64_t inputOfKind(const TestContext& ctx, int rank, size_t kind) {
  const auto r = static_cast<size_t>(rank);
  // Products of +-1 (or of 1 and 2, wrapping) are exact in every type. The
  // kind's bits say which of three ranks (and every third after) hold -1
  // (or 2), so that across kinds the product differs from the minimum and
  // the maximum at any number of ranks.
  if (ctx.op == braidProd) {
    const bool flipped = ((kind >> (r % 3)) & 1) != 0;
    if (ctx.type->isSigned) return flipped ? -1 : 1;
    return flipped ? 2 : 1;
  }
  auto residue = static_cast<int64_t>((kind * 7 + r * 3) % inputKinds(ctx));
  return ctx.type->isSigned ? residue - inputAmplitude(ctx) : residue;
}

// A 64-bit mix of (rank, index) (splitmix64's finalizer): neighbouring
// elements and ranks get unrelated values.
uint64_t distinctHash(int rank, size_t index) {
  uint64_t x = (static_cast<uint64_t>(rank) << 48) ^ static_cast<uint64_t>(index);
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The hash as a value of the type: all of its bits for integers (stores
// truncate to the width), an integer exact in the type for floating types.
int64_t distinctValue(const DataType& type, int rank, size_t index) {
  uint64_t hash = distinctHash(rank, index);
  if (!type.isFloat) return static_cast<int64_t>(hash);
  auto limit = static_cast<uint64_t>(std::min(type.maxExactInt, 1e15));
  return static_cast<int64_t>(hash % (2 * limit + 1)) - static_cast<int64_t>(limit);
}

}  // namespace

int64_t inputValue(const TestContext& ctx, int rank, size_t index) {
  return inputOfKind(ctx, rank, inputKind(ctx, index));
}

void fillInputs(const TestContext& ctx, int rank, size_t firstIndex, void* buffer, size_t count) {
  // One value per kind computed; the inner loop hashes and stores.
  const size_t kinds = inputKinds(ctx);
  std::vector<int64_t> values(kinds);
  for (size_t k = 0; k < kinds; ++k) values[k] = inputOfKind(ctx, rank, k);
  for (size_t i = 0; i < count; ++i)
    storeInt(*ctx.type, buffer, i, values[inputKind(ctx, firstIndex + i)]);
}

Expected copiedInput(const TestContext& ctx, int rank, size_t index) {
  int64_t value = inputValue(ctx, rank, index);
  return {value, static_cast<double>(value), false};
}

std::function<Expected(size_t)> reducedInputs(const TestContext& ctx) {
  const size_t kinds = inputKinds(ctx);
  std::vector<Expected> table(kinds);
  for (size_t kind = 0; kind < kinds; ++kind) {
    // Integers in uint64, so that sums and products wrap as the type's do.
    uint64_t wrapped = ctx.op == braidProd ? 1 : 0;
    int64_t lowest = INT64_MAX, highest = INT64_MIN, sum = 0;
    for (int rank = 0; rank < ctx.nranks; ++rank) {
      int64_t value = inputOfKind(ctx, rank, kind);
      wrapped = ctx.op == braidProd ? wrapped * static_cast<uint64_t>(value)
                                    : wrapped + static_cast<uint64_t>(value);
      lowest = std::min(lowest, value);
      highest = std::max(highest, value);
      sum += value;
    }
    Expected& e = table[kind];
    switch (ctx.op) {
      case braidMin:
        e = {lowest, static_cast<double>(lowest)};
        break;
      case braidMax:
        e = {highest, static_cast<double>(highest)};
        break;
      case braidAvg:  // integers truncate toward zero, as C++ division does
        e = {sum / ctx.nranks, static_cast<double>(sum) / ctx.nranks, ctx.type->isFloat};
        break;
      default:
        e.integer = static_cast<int64_t>(wrapped);
        e.real = static_cast<double>(e.integer);  // exact: float inputs never wrap
        break;
    }
  }
  return [table = std::move(table), ctx](size_t index) { return table[inputKind(ctx, index)]; };
}

int64_t countWrong(const TestContext& ctx, const void* buffer, size_t count, size_t firstIndex,
                   const std::function<Expected(size_t)>& expected) {
  const DataType& type = *ctx.type;
  const uint64_t widthMask = type.size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * type.size)) - 1;
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    Expected want = expected(firstIndex + i);
    bool ok;
    if (!type.isFloat) {
      ok =
          ((static_cast<uint64_t>(loadInt(type, buffer, i)) ^ static_cast<uint64_t>(want.integer)) &
           widthMask) == 0;
    } else if (want.rounded && want.real != 0) {  // an exact sum divided by nranks
      double ulp = std::ldexp(1.0, std::ilogb(want.real) - type.mantissaBits);
      ok = std::fabs(loadReal(type, buffer, i) - want.real) <= 2 * ulp;
    } else {
      ok = loadReal(type, buffer, i) == want.real;
    }
    wrong += ok ? 0 : 1;
  }
  return wrong;
}

void fillDistinct(const TestContext& ctx, int rank, size_t firstIndex, void* buffer, size_t count) {
  for (size_t i = 0; i < count; ++i)
    storeInt(*ctx.type, buffer, i, distinctValue(*ctx.type, rank, firstIndex + i));
}

int64_t countWrongDistinct(const TestContext& ctx, const void* buffer, size_t count, int rank,
                           size_t firstIndex) {
  const DataType& type = *ctx.type;
  const uint64_t widthMask = type.size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * type.size)) - 1;
  int64_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    int64_t want = distinctValue(type, rank, firstIndex + i);
    bool ok =
        type.isFloat
            ? loadReal(type, buffer, i) == static_cast<double>(want)
            : ((static_cast<uint64_t>(loadInt(type, buffer, i)) ^ static_cast<uint64_t>(want)) &
               widthMask) == 0;
    wrong += ok ? 0 : 1;
  }
  return wrong;
}

Sizes wholeBufferSizes(size_t bytes, size_t eltSize) {
  const size_t count = bytes / eltSize;
  return {.bytes = count * eltSize,
          .count = count,
          .sendCount = count,
          .recvCount = count,
          .sendInPlaceOffset = 0,
          .recvInPlaceOffset = 0,
          .algBytes = count * eltSize};
}

size_t perRankCount(size_t bytes, size_t eltSize, int nranks) {
  // Whole 16-byte units per rank, as nccl-tests aligns its buffers.
  const size_t unit = 16 / eltSize;
  return bytes / eltSize / static_cast<size_t>(nranks) / unit * unit;
}

Sizes gatheredSizes(size_t bytes, size_t eltSize, int nranks) {
  const size_t part = perRankCount(bytes, eltSize, nranks);
  const size_t total = part * static_cast<size_t>(nranks);
  return {.bytes = total * eltSize,
          .count = part,
          .sendCount = part,
          .recvCount = total,
          .sendInPlaceOffset = part,
          .recvInPlaceOffset = 0,
          .algBytes = total * eltSize};
}

Sizes scatteredSizes(size_t bytes, size_t eltSize, int nranks) {
  const size_t part = perRankCount(bytes, eltSize, nranks);
  const size_t total = part * static_cast<size_t>(nranks);
  return {.bytes = total * eltSize,
          .count = part,
          .sendCount = total,
          .recvCount = part,
          .sendInPlaceOffset = 0,
          .recvInPlaceOffset = part,
          .algBytes = total * eltSize};
}

double partsBusBwFactor(int nranks) {
  return static_cast<double>(nranks - 1) / nranks;
}

}  // namespace braid::perf
