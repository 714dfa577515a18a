// Pure rank and index arithmetic shared by the algorithms: how a vector is
// cut into per-rank blocks and pipelining chunks, and who talks to whom.
#pragma once

#include <algorithm>
#include <cstddef>

namespace braid::algo {

// Part `index` of `total` items cut into `parts` nearly equal parts, the
// first `total % parts` parts one item larger.
struct Range {
  size_t begin = 0;
  size_t size = 0;
};
inline Range evenPart(size_t total, size_t parts, size_t index) {
  size_t base = total / parts, extra = total % parts;
  return {index * base + std::min(index, extra), base + (index < extra ? 1 : 0)};
}

inline int modRank(long long r, int n) {
  return static_cast<int>(((r % n) + n) % n);
}

// How many chunks of at most chunkElements cover `elements` (at least one, so
// that empty blocks still produce the matching zero-byte messages).
inline size_t chunkCount(size_t elements, size_t chunkElements) {
  chunkElements = std::max<size_t>(chunkElements, 1);
  return std::max<size_t>(1, (elements + chunkElements - 1) / chunkElements);
}

}  // namespace braid::algo
