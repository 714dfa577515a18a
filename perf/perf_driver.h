// The shared driver of the collective perf tests (all_reduce_perf, ...). It
// follows the nccl-tests conventions: the same flags, the same table, the same
// sizes and bandwidth definitions, so that numbers can be compared side by
// side.
//
// A test is a Collective description; its main() is one call to perfMain().
// Every process calls braidCommInitFromEnv (start them with braidrun, or with
// mpirun and BRAID_ADDR); only rank 0 prints and writes the --json file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "braid.h"

namespace braid::perf {

// A datatype as the tests see it.
struct DataType {
  const char* name;  // nccl-tests spelling: "float", "half", "bfloat16", ...
  braidDataType_t type;
  size_t size;
  bool isFloat;
  bool isSigned;
  double maxExactInt;  // every integer of magnitude up to this is exact in the type
  int mantissaBits;    // explicit mantissa bits of floating types (their ULP)
};

// Element counts of one measurement, for one rank.
struct Sizes {
  size_t bytes;      // the "size (B)" column
  size_t count;      // the "count (elements)" column, the count argument of the call
  size_t sendCount;  // elements of the send buffer
  size_t recvCount;  // elements of the receive buffer
  // In place, send and receive buffers lie in one allocation of
  // max(sendCount, recvCount) elements, at these offsets times the rank.
  size_t sendInPlaceOffset;
  size_t recvInPlaceOffset;
  size_t algBytes;  // bytes moved by the operation, the S of algbw = S / time
};

// Everything a collective's callbacks need to know about the measurement.
struct TestContext {
  braidComm_t comm;
  int rank;
  int nranks;
  const DataType* type;
  braidRedOp_t op;  // meaningful only when the collective reduces
  int root;         // meaningful only when the collective has a root (else -1)
  Sizes sizes;
  bool inPlace = false;
  // Where the calls go: NULL (-z 1, the default: every call complete when it
  // returns) or a braid stream (-z 0: calls queued and waited for once, as
  // nccl-tests launches on a CUDA stream).
  braidStream_t stream = nullptr;
};

// What a test supplies to the driver.
struct Collective {
  const char* name;       // "all_reduce_perf"
  const char* braidName;  // "allreduce", for braidCommGetLastAlgorithm; NULL if none
  bool usesOp;            // else the redop column reads "none"
  bool usesRoot;          // else the root column reads -1
  // False where braid defines no in-place form (AllToAll, Send/Recv): the
  // in-place columns then read N/A instead of timing a call braid rejects.
  bool hasInPlace;
  // True where only the root holds a result (Reduce, Gather), so that only
  // the root's receive buffer is checked.
  bool resultAtRootOnly;
  Sizes (*sizesFor)(size_t bytes, size_t eltSize, int nranks);
  double (*busBwFactor)(int nranks);  // busbw = algbw * factor
  // Fills this rank's send buffer (ctx.sizes.sendCount elements).
  void (*initData)(const TestContext& ctx, void* send);
  // Issues the call on ctx.stream; the driver waits for it.
  braidResult_t (*run)(const TestContext& ctx, const void* send, void* recv);
  // Counts the wrong elements of this rank's result in `recv`.
  int64_t (*check)(const TestContext& ctx, const void* recv);
};

// Parses the nccl-tests flags, runs the sweep, prints the table on rank 0.
// Returns the process exit code: 0, or 1 when a result was wrong or a call
// failed, 2 for bad flags.
int perfMain(int argc, char** argv, const Collective& collective);

// --- Sizes ----------------------------------------------------------------------
// nccl-tests' size conventions, shared by the tests.

// "32M" -> 33554432: K, M and G are powers of 1024, as in nccl-tests.
// Throws std::invalid_argument on anything else.
size_t parseBytes(const std::string& text);

// One buffer of bytes/eltSize elements (AllReduce, Broadcast, Reduce, SendRecv).
Sizes wholeBufferSizes(size_t bytes, size_t eltSize);

// nccl-tests' per-rank count of the collectives whose size is the total
// buffer (AllGather, ReduceScatter, AlltoAll, Gather, Scatter):
// bytes / nranks / eltSize, rounded down to a multiple of 16 bytes.
size_t perRankCount(size_t bytes, size_t eltSize, int nranks);

// The collectives whose output is the ranks' parts side by side (AllGather,
// Gather): count is each rank's part; in place, a rank's send buffer is its
// own part of the output.
Sizes gatheredSizes(size_t bytes, size_t eltSize, int nranks);

// The collectives whose input is one part for each rank (ReduceScatter,
// Scatter): count is each rank's part of the result; in place, a rank's
// receive buffer is its own part of the input.
Sizes scatteredSizes(size_t bytes, size_t eltSize, int nranks);

// nccl-tests' bus bandwidth factor of the collectives in parts (AllGather,
// ReduceScatter, AllToAll, Gather, Scatter): n-1 of the n parts cross a
// link, the rank's own stays.
double partsBusBwFactor(int nranks);

// `elements` elements past `buffer`.
inline const void* elementAt(const TestContext& ctx, const void* buffer, size_t elements) {
  return static_cast<const std::byte*>(buffer) + elements * ctx.type->size;
}

// --- Test data ----------------------------------------------------------------
// Inputs of reductions are small integers chosen per datatype, op and number
// of ranks so that every reduction over all ranks is exact in the datatype
// (integer sums and products wrap in the type's width, as braid specifies,
// which is also exact). Only avg on floating types rounds, in its final
// division.

// A value a result element should hold: `integer` for integer datatypes (it is
// compared in the type's width), `real` for floating ones.
struct Expected {
  int64_t integer = 0;
  double real = 0;
  bool rounded = false;  // compare `real` within 2 ULPs of the datatype, not exactly
};

// The input of `rank` at element `index` (as a small integer).
int64_t inputValue(const TestContext& ctx, int rank, size_t index);

// Writes inputValue(ctx, rank, firstIndex + i) to element i, for i < count.
void fillInputs(const TestContext& ctx, int rank, size_t firstIndex, void* buffer, size_t count);

// The input of `rank` at `index`, as an expected result (for copies).
Expected copiedInput(const TestContext& ctx, int rank, size_t index);

// ctx.op over all ranks of the inputs at each element index: a function of
// index that tabulates one result per kind of element (the inputs depend on
// the kind, a hash of the index), so that checking costs O(count), not
// O(count * nranks).
std::function<Expected(size_t index)> reducedInputs(const TestContext& ctx);

// How many of `count` elements of `buffer` differ from expected(firstIndex + i).
int64_t countWrong(const TestContext& ctx, const void* buffer, size_t count, size_t firstIndex,
                   const std::function<Expected(size_t index)>& expected);

// Data of the collectives that only move data (AllGather, AlltoAll,
// Broadcast, Gather, Scatter, SendRecv): a hash of (rank, index), exact in
// the datatype and without period, so that an element that lands in the
// wrong place, or comes from the wrong rank, reads wrong.
void fillDistinct(const TestContext& ctx, int rank, size_t firstIndex, void* buffer, size_t count);

// How many of `count` elements of `buffer` differ from what fillDistinct
// writes for (rank, firstIndex + i).
int64_t countWrongDistinct(const TestContext& ctx, const void* buffer, size_t count, int rank,
                           size_t firstIndex);

}  // namespace braid::perf
