// The two trees of the double binary tree (NCCL's construction, after
// Sanders, Speck and Traeff): pure rank arithmetic, no schedules.
//
// Tree 0 is the in-order binary tree on 0..n-1: rank 0 is the root with a
// single child, the largest power of two below n; every odd rank is a leaf.
// Tree 1 gives the other parity the internal roles, so that each rank is
// internal in at most one tree and the two halves of the vector load every
// rank about equally:
//   n even: mirror, rank r plays n-1-r of tree 0;
//   n odd:  shift, rank r plays r+1 of tree 0 built over n+1 ranks, whose
//           root (index 0) is dropped. (NCCL's shift, r playing r-1 mod n,
//           makes rank 0 internal in both trees for odd n.)
//
//   n = 6, tree 0:  0 -- 4 -+- 2 -+- 1       tree 1:  5 -- 1 -+- 0
//                           |     '- 3                        '- 3 -+- 2
//                           '- 5                                    '- 4
#pragma once

#include <array>

namespace braid::algo {

struct DbtreeLinks {
  int parent = -1;                         // -1 at the root
  std::array<int, 2> children = {-1, -1};  // smaller rank first; -1 = none
  int childCount() const { return (children[0] >= 0) + (children[1] >= 0); }
};

// Links of `rank` in tree 0 or tree 1 of the double binary tree on nranks.
DbtreeLinks dbtreeLinks(int nranks, int tree, int rank);

// Edges on the longest root-to-leaf path of either tree (0 for one rank).
int dbtreeDepth(int nranks);

}  // namespace braid::algo
