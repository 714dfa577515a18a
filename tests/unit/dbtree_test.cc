// The double binary tree's rank arithmetic: both trees are trees over all
// ranks, parent and child links agree, no rank is internal in both, and
// the depth is logarithmic.
#include "algorithms/dbtree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace braid::algo {
namespace {

std::vector<int> worldSizes() {
  std::vector<int> sizes;
  for (int n = 1; n <= 64; ++n) sizes.push_back(n);
  sizes.push_back(1000);
  return sizes;
}

int ceilLog2(int n) {
  int bits = 0;
  while ((1 << bits) < n) ++bits;
  return bits;
}

class DbtreeWorld : public ::testing::TestWithParam<int> {};

TEST_P(DbtreeWorld, EachTreeSpansAllRanksWithConsistentLinks) {
  const int n = GetParam();
  int deepest = 0;
  for (int tree = 0; tree < 2; ++tree) {
    std::vector<DbtreeLinks> links;
    for (int r = 0; r < n; ++r) links.push_back(dbtreeLinks(n, tree, r));
    int roots = 0;
    for (int r = 0; r < n; ++r) {
      const DbtreeLinks& l = links[r];
      if (l.parent < 0) {
        ++roots;
      } else {
        ASSERT_LT(l.parent, n) << "n=" << n << " tree " << tree << " rank " << r;
        ASSERT_NE(l.parent, r);
        const auto& siblings = links[l.parent].children;
        EXPECT_TRUE(siblings[0] == r || siblings[1] == r)
            << "n=" << n << " tree " << tree << ": " << l.parent << " does not list child " << r;
      }
      if (l.children[1] >= 0) {
        EXPECT_LT(l.children[0], l.children[1]) << "children out of order";
      }
      for (int c : l.children) {
        if (c < 0) continue;
        ASSERT_LT(c, n);
        EXPECT_EQ(links[c].parent, r) << "n=" << n << " tree " << tree << " child " << c;
      }
      if (l.children[0] < 0) {
        EXPECT_LT(l.children[1], 0) << "second child without a first";
      }
    }
    EXPECT_EQ(roots, 1) << "n=" << n << " tree " << tree;
    // Walking up from every rank reaches the root within n steps: no cycle,
    // so with one root the parent links form a single tree over all ranks.
    for (int r = 0; r < n; ++r) {
      int depth = 0;
      for (int at = r; links[at].parent >= 0; at = links[at].parent) {
        ++depth;
        ASSERT_LT(depth, n) << "n=" << n << " tree " << tree << ": cycle above rank " << r;
      }
      deepest = std::max(deepest, depth);
    }
  }
  EXPECT_EQ(deepest, dbtreeDepth(n)) << "n=" << n;
  EXPECT_LE(dbtreeDepth(n), ceilLog2(n) + 1) << "n=" << n;
}

TEST_P(DbtreeWorld, NoRankIsInternalInBothTrees) {
  const int n = GetParam();
  for (int r = 0; r < n; ++r)
    EXPECT_FALSE(dbtreeLinks(n, 0, r).childCount() > 0 && dbtreeLinks(n, 1, r).childCount() > 0)
        << "n=" << n << " rank " << r;
}

TEST_P(DbtreeWorld, TreeZeroIsRootedAtZeroWithTheLargestPowerOfTwoBelow) {
  const int n = GetParam();
  DbtreeLinks root = dbtreeLinks(n, 0, 0);
  EXPECT_EQ(root.parent, -1);
  EXPECT_LE(root.childCount(), 1);
  if (n > 1) {
    int top = 1;
    while (top * 2 < n) top *= 2;
    EXPECT_EQ(root.children[0], top) << "n=" << n;
  }
  for (int r = 1; r < n; r += 2) EXPECT_EQ(dbtreeLinks(n, 0, r).childCount(), 0) << r;
}

// Even sizes mirror tree 0; odd sizes shift tree 0 of n+1 ranks down by one.
TEST_P(DbtreeWorld, TreeOneIsTheMirrorOrShiftOfTreeZero) {
  const int n = GetParam();
  for (int r = 0; r < n; ++r) {
    int expected =
        n % 2 == 0 ? dbtreeLinks(n, 0, n - 1 - r).parent : dbtreeLinks(n + 1, 0, r + 1).parent;
    if (expected >= 0) expected = n % 2 == 0 ? n - 1 - expected : expected - 1;
    EXPECT_EQ(dbtreeLinks(n, 1, r).parent, expected) << "n=" << n << " rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(N, DbtreeWorld, ::testing::ValuesIn(worldSizes()));

}  // namespace
}  // namespace braid::algo
