// Binomial-tree Gather and Scatter over virtual ranks v = rank - root (mod
// P): ceil(log2 P) message latencies on the critical path where the linear
// algorithms have P-1. Virtual rank v's subtree is [v, v + min(lowbit(v),
// P - v)); an inner rank keeps its subtree's blocks in scratch, in virtual
// order, so that what it exchanges with its parent is one contiguous run.
//
//        v0            gather: blocks flow up, each inner rank passing
//      / |  '.         its run [v, v + subtree) to its parent;
//    v4  v2  v1        scatter: runs flow down, largest subtree first.
//    | '.  |
//   v6  v5 v3          (P = 8; v7 under v6)
//
// At the root, runs map to Recv (Gather) or Send (Scatter) in real rank
// order; the one run that wraps past rank P-1 goes through scratch.
//
//   time ceil(log2 P) alpha + (P-1) count beta (bytes through the root,
//   as for the linear algorithms), plus local copies at inner ranks.
#include <algorithm>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/blocks.h"
#include "algorithms/patterns.h"

namespace braid::algo {

Schedule planGatherBinomial(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, root = args.root;
  const int v = modRank(args.rank - root, P);
  const size_t bb = args.bytes();
  auto real = [&](int virt) { return modRank(virt + root, P); };
  const Slice own{BufferId::kSend, 0, bb};
  const std::vector<int> children = binomialChildOffsets(v, P);
  if (v != 0) {
    const int parent = real(binomialParent(v));
    if (children.empty()) {
      plan.send(parent, own);
      return plan;
    }
    const int size = subtreeSize(v, P);
    plan.scratchBytes = size * bb;
    std::vector<StepIndex> ready = {plan.copy(blockRange(BufferId::kScratch, 0, 1, bb), own)};
    for (int m : children)
      ready.push_back(
          plan.recv(real(v + m), blockRange(BufferId::kScratch, m, subtreeSize(v + m, P), bb)));
    plan.send(parent, blockRange(BufferId::kScratch, 0, size, bb), joinSteps(plan, ready));
    return plan;
  }
  if (!args.inPlace) plan.copy(blockRange(BufferId::kRecv, root, 1, bb), own);
  for (int m : children) {
    const int size = subtreeSize(m, P), first = real(m);
    if (first + size <= P) {
      plan.recv(real(m), blockRange(BufferId::kRecv, first, size, bb));
      continue;
    }
    const int head = P - first;
    plan.scratchBytes = size * bb;
    StepIndex got = plan.recv(real(m), blockRange(BufferId::kScratch, 0, size, bb));
    plan.copy(blockRange(BufferId::kRecv, first, head, bb),
              blockRange(BufferId::kScratch, 0, head, bb), got);
    plan.copy(blockRange(BufferId::kRecv, 0, size - head, bb),
              blockRange(BufferId::kScratch, head, size - head, bb), got);
  }
  return plan;
}

Schedule planScatterBinomial(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, root = args.root;
  const int v = modRank(args.rank - root, P);
  const size_t bb = args.bytes();
  auto real = [&](int virt) { return modRank(virt + root, P); };
  const Slice own{BufferId::kRecv, 0, bb};
  const std::vector<int> children = binomialChildOffsets(v, P);
  if (v != 0) {
    const int parent = real(binomialParent(v));
    if (children.empty()) {
      plan.recv(parent, own);
      return plan;
    }
    const int size = subtreeSize(v, P);
    plan.scratchBytes = size * bb;
    StepIndex got = plan.recv(parent, blockRange(BufferId::kScratch, 0, size, bb));
    for (int m : children)
      plan.send(real(v + m), blockRange(BufferId::kScratch, m, subtreeSize(v + m, P), bb), got);
    plan.copy(own, blockRange(BufferId::kScratch, 0, 1, bb), got);
    return plan;
  }
  for (int m : children) {
    const int size = subtreeSize(m, P), first = real(m);
    if (first + size <= P) {
      plan.send(real(m), blockRange(BufferId::kSend, first, size, bb));
      continue;
    }
    const int head = P - first;
    plan.scratchBytes = size * bb;
    StepIndex a = plan.copy(blockRange(BufferId::kScratch, 0, head, bb),
                            blockRange(BufferId::kSend, first, head, bb));
    StepIndex b = plan.copy(blockRange(BufferId::kScratch, head, size - head, bb),
                            blockRange(BufferId::kSend, 0, size - head, bb));
    plan.send(real(m), blockRange(BufferId::kScratch, 0, size, bb), a, b);
  }
  if (!args.inPlace) plan.copy(own, blockRange(BufferId::kSend, root, 1, bb));
  return plan;
}

// The root moves (P-1) blocks over its link, in ceil(log2 P) messages.
Cost estimateGatherBinomial(const CollectiveArgs& a, const LinkModel& m) {
  Cost c;
  if (a.nranks == 1) return c;
  c.steps = ceilLog2(a.nranks);
  c.bytesSent = static_cast<double>(a.bytes()) * (a.nranks - 1);
  c.seconds = c.steps * m.alpha + c.bytesSent * m.beta;
  return c;
}

Cost estimateScatterBinomial(const CollectiveArgs& a, const LinkModel& m) {
  return estimateGatherBinomial(a, m);
}

}  // namespace braid::algo
