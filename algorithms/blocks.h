// Pure helpers shared by the broadcast, reduce, allgather, reduce-scatter,
// alltoall, gather and scatter planners: binomial trees over virtual ranks,
// the power-of-two fold, runs of equal blocks, and joining many steps into
// one that a later step can wait for.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "algorithms/patterns.h"
#include "algorithms/schedule.h"

namespace braid::algo {

// Smallest k with 2^k >= n (0 for n <= 1).
inline int ceilLog2(int n) {
  int k = 0;
  while ((1LL << k) < n) ++k;
  return k;
}

// Largest power of two <= n (n >= 1).
inline int floorPow2(int n) {
  int p = 1;
  while (2LL * p <= n) p *= 2;
  return p;
}

// Binomial tree over virtual ranks 0..P-1 (the root is 0): v's parent is
// v - lowbit(v), and v owns the contiguous range [v, v + subtreeSize(v)).
inline int lowBit(int v) {
  return v & -v;
}
inline int subtreeSize(int v, int nranks) {
  if (v == 0) return nranks;
  return std::min(lowBit(v), nranks - v);
}
inline int binomialParent(int v) {
  return v - lowBit(v);
}
// Offsets m (children are v + m), largest subtree first.
inline std::vector<int> binomialChildOffsets(int v, int nranks) {
  std::vector<int> offsets;
  const int limit = v == 0 ? floorPow2(std::max(nranks - 1, 1)) * 2 : lowBit(v);
  for (int m = limit / 2; m >= 1; m /= 2)
    if (v + m < nranks) offsets.push_back(m);
  return offsets;
}

// The fold of P ranks onto the largest power of two p2 <= P: with
// rem = P - p2, ranks 2i and 2i+1 (i < rem) pair up and 2i+1 acts for both
// as "new rank" i; rank r >= 2*rem is new rank r - rem. New ranks [a, b)
// stand for the contiguous original ranks [origBegin(a), origBegin(b)).
struct Fold {
  int p2 = 1;
  int rem = 0;
  explicit Fold(int nranks) : p2(floorPow2(nranks)), rem(nranks - floorPow2(nranks)) {}
  bool folded(int r) const { return r < 2 * rem && r % 2 == 0; }  // idle during the rounds
  int newRank(int r) const { return r < 2 * rem ? r / 2 : r - rem; }
  int oldRank(int q) const { return q < rem ? 2 * q + 1 : q + rem; }
  int origBegin(int q) const { return q < rem ? 2 * q : q + rem; }
};

// Bytes of `n` consecutive blocks starting at block `first`, in a buffer of
// blocks of `blockBytes` that starts at `base`.
inline Slice blockRange(BufferId buffer, long first, long n, size_t blockBytes, size_t base = 0) {
  return {buffer, base + static_cast<size_t>(first) * blockBytes,
          static_cast<size_t>(n) * blockBytes};
}

// A vector of `count` elements cut into P blocks numbered by virtual rank
// (evenPart), and each block into the same number of chunks, so that both
// ends of every message agree on its size even when blocks differ by one.
class VectorBlocks {
 public:
  VectorBlocks(size_t count, int nranks, size_t es, size_t chunkBytes)
      : count_(count), nranks_(nranks), es_(es), maxBlock_(evenPart(count, nranks, 0).size) {
    chunks_ = chunkCount(maxBlock_, std::max<size_t>(1, chunkBytes / es));
  }
  size_t chunks() const { return chunks_; }
  size_t maxBlockBytes() const { return maxBlock_ * es_; }
  // Blocks [first, first + n): contiguous, blocks being numbered in vector order.
  Slice range(BufferId buffer, int first, int n) const {
    const size_t begin = evenPart(count_, nranks_, first).begin;
    const size_t end = first + n < nranks_ ? evenPart(count_, nranks_, first + n).begin : count_;
    return {buffer, begin * es_, (end - begin) * es_};
  }
  Slice chunk(BufferId buffer, int block, size_t c) const {
    Range b = evenPart(count_, nranks_, block);
    Range ch = evenPart(b.size, chunks_, c);
    return {buffer, (b.begin + ch.begin) * es_, ch.size * es_};
  }
  // Chunk c of a one-block scratch slot starting at `base`, sized for `bytes`.
  Slice slot(size_t base, size_t c, size_t bytes) const {
    return {BufferId::kScratch, base + evenPart(maxBlock_, chunks_, c).begin * es_, bytes};
  }

 private:
  size_t count_;
  int nranks_;
  size_t es_;
  size_t maxBlock_;
  size_t chunks_ = 1;
};

// A step that completes once every step in `steps` has (kNoStep entries are
// ignored): zero-byte copies chained two dependencies at a time.
inline StepIndex joinSteps(Schedule& plan, const std::vector<StepIndex>& steps) {
  StepIndex joined = kNoStep;
  for (StepIndex s : steps) {
    if (s == kNoStep) continue;
    if (joined == kNoStep) {
      joined = s;
      continue;
    }
    const Slice none{BufferId::kScratch, 0, 0};
    joined = plan.copy(none, none, joined, s);
  }
  return joined;
}

// Step indices of a pipelined algorithm, [round][chunk]; at() reads a
// round before the first as "no step", so round 0 waits for nothing.
using StepGrid = std::vector<std::vector<StepIndex>>;

inline StepIndex at(const StepGrid& grid, long s, size_t c) {
  return s < 0 ? kNoStep : grid[static_cast<size_t>(s)][c];
}

}  // namespace braid::algo
