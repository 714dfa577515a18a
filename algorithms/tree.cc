// Binomial-tree Broadcast and Reduce, over ranks renumbered so that the root
// is virtual rank 0. Virtual rank v receives from v - lowbit(v) and serves
// v + 2^k for every 2^k below lowbit(v): ceil(log2 P) rounds.
//
//        0            broadcast: data flows down, reduce: partial results up
//      / | '.
//     4  2  1         (P = 8)
//    /|  |
//   6 5  3
//   |
//   7
//
// The vector is cut into chunks so that a rank forwards chunk c while chunk
// c+1 is still arriving: deep trees pipeline instead of waiting per level.
#include <algorithm>
#include <cmath>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/patterns.h"

namespace braid::algo {
namespace {

struct TreeLinks {
  int parent = -1;            // real rank, -1 at the root
  std::vector<int> children;  // real ranks, nearest subtree last
};

// Broadcast order: largest subtree first, so the deepest path starts earliest.
TreeLinks binomialLinks(int rank, int root, int nranks) {
  TreeLinks links;
  const int v = modRank(rank - root, nranks);
  int mask = 1;
  while (mask < nranks) {
    if (v & mask) {
      links.parent = modRank(v - mask + root, nranks);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < nranks) links.children.push_back(modRank(v + mask + root, nranks));
  return links;
}

Slice chunkOf(BufferId buffer, size_t count, size_t chunks, size_t c, size_t es) {
  Range ch = evenPart(count, chunks, c);
  return {buffer, ch.begin * es, ch.size * es};
}

}  // namespace

Schedule planBroadcastTree(const CollectiveArgs& args) {
  Schedule plan;
  const size_t es = args.elementSize();
  const size_t C = chunkCount(args.count, std::max<size_t>(1, args.chunkBytes / es));
  const bool isRoot = args.rank == args.root;
  TreeLinks links = binomialLinks(args.rank, args.root, args.nranks);
  for (size_t c = 0; c < C; ++c) {
    Slice mine = chunkOf(BufferId::kRecv, args.count, C, c, es);
    StepIndex ready = kNoStep;
    Slice src = mine;
    if (isRoot) {
      if (!args.inPlace) {
        src = chunkOf(BufferId::kSend, args.count, C, c, es);
        plan.copy(mine, src);
      }
    } else {
      ready = plan.recv(links.parent, mine);
    }
    for (int child : links.children) plan.send(child, src, ready);
  }
  return plan;
}

Schedule planReduceTree(const CollectiveArgs& args) {
  Schedule plan;
  const size_t es = args.elementSize();
  const size_t chunkElements = std::max<size_t>(1, args.chunkBytes / es);
  const size_t C = chunkCount(args.count, chunkElements);
  const bool isRoot = args.rank == args.root;
  TreeLinks links = binomialLinks(args.rank, args.root, args.nranks);
  // Reduction order: nearest (smallest) subtree first, it finishes first.
  std::vector<int> children(links.children.rbegin(), links.children.rend());
  const size_t slotBytes = std::min(chunkElements, args.count) * es;
  const BufferId accBuffer = isRoot ? BufferId::kRecv : BufferId::kScratch;
  const size_t accBytes = isRoot || children.empty() ? 0 : args.bytes();
  plan.scratchBytes = accBytes + children.size() * 2 * slotBytes;

  std::vector<std::vector<StepIndex>> reduced(children.size(), std::vector<StepIndex>(C));
  for (size_t c = 0; c < C; ++c) {
    Slice acc = chunkOf(accBuffer, args.count, C, c, es);
    Slice own = chunkOf(BufferId::kSend, args.count, C, c, es);
    StepIndex last = kNoStep;
    for (size_t i = 0; i < children.size(); ++i) {
      Slice incoming{BufferId::kScratch, accBytes + (2 * i + c % 2) * slotBytes, acc.bytes};
      StepIndex got = plan.recv(children[i], incoming, c >= 2 ? reduced[i][c - 2] : kNoStep);
      last = reduced[i][c] = plan.reduce(acc, incoming, i == 0 ? own : acc, got, last);
    }
    if (isRoot) {
      if (children.empty() && !args.inPlace) last = plan.copy(acc, own);
      if (args.op == RedOp::kAvg) plan.average(acc, last);
    } else {
      plan.send(links.parent, children.empty() ? own : acc, last);
    }
  }
  return plan;
}

}  // namespace braid::algo

namespace braid::algo {

namespace {
int treeDepth(int nranks) {
  int depth = 0;
  while ((1 << depth) < nranks) ++depth;
  return depth;
}
}  // namespace

// Pipelined binomial tree: the root sends every chunk to each of its
// ceil(log2 P) children; the last chunk reaches the deepest leaf after
// depth more chunk times.
Cost estimateBroadcastTree(const CollectiveArgs& a, const LinkModel& m) {
  Cost c;
  const int depth = treeDepth(a.nranks);
  if (depth == 0) return c;
  const double bytes = static_cast<double>(a.bytes());
  const double chunks = std::max(1.0, std::ceil(bytes / std::max<size_t>(a.chunkBytes, 1)));
  const double chunk = bytes / chunks;
  c.steps = depth;
  c.bytesSent = depth * bytes;
  c.seconds = (depth * chunks + depth - 1) * (m.alpha + chunk * m.beta);
  return c;
}

Cost estimateReduceTree(const CollectiveArgs& a, const LinkModel& m) {
  Cost c = estimateBroadcastTree(a, m);
  c.seconds += treeDepth(a.nranks) * static_cast<double>(a.bytes()) * m.gamma;
  return c;
}

}  // namespace braid::algo
