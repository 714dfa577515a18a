#include "algorithms/dbtree.h"

#include <utility>

namespace braid::algo {
namespace {

// Tree 0. A rank's lowest set bit is its height: rank r with low bit b
// (b > 1) has children r -+ b/2, the right one pulled in while it lies past
// the end; its parent is the rank one level up whose subtree spans r.
DbtreeLinks inOrderLinks(int n, int r) {
  DbtreeLinks links;
  if (r == 0) {
    int top = 1;
    while (top * 2 < n) top *= 2;
    if (n > 1) links.children[0] = top;
    return links;
  }
  const int b = r & -r;
  links.parent = (r ^ b) | (b << 1);
  // Past the end: the parent that would have spanned r does not exist, so
  // r hangs from the rank below it (a right child pulled in, or the top).
  if (links.parent >= n) links.parent = r ^ b;
  if (b > 1) {
    links.children[0] = r - b / 2;
    int offset = b / 2;
    while (offset > 0 && r + offset >= n) offset /= 2;
    if (offset > 0) links.children[1] = r + offset;
  }
  return links;
}

// Renames every rank in `links` with f (f(-1) must stay -1) and keeps the
// smaller child first.
template <typename F>
DbtreeLinks renamed(DbtreeLinks links, F f) {
  links.parent = f(links.parent);
  for (int& c : links.children) c = f(c);
  if (links.children[1] >= 0 && (links.children[0] < 0 || links.children[1] < links.children[0]))
    std::swap(links.children[0], links.children[1]);
  return links;
}

}  // namespace

DbtreeLinks dbtreeLinks(int n, int tree, int rank) {
  if (tree == 0) return inOrderLinks(n, rank);
  if (n % 2 == 0)
    return renamed(inOrderLinks(n, n - 1 - rank), [n](int x) { return x < 0 ? -1 : n - 1 - x; });
  // Index 0 of the (n+1)-rank tree is dropped: its only child becomes the
  // root, and no other rank has it as parent or child.
  return renamed(inOrderLinks(n + 1, rank + 1), [](int x) { return x <= 0 ? -1 : x - 1; });
}

int dbtreeDepth(int n) {
  // Tree 0 is the deeper one: 0 -> top -> top/2 -> ... -> 1, one edge per
  // bit of n-1. The odd-n tree 1 is tree 0 of n+1 ranks without its root.
  if (n <= 1) return 0;
  int depth = 1;
  for (int top = 1; top * 2 < n; top *= 2) ++depth;
  return depth;
}

}  // namespace braid::algo
