// Double-binary-tree AllReduce (NCCL's tree algorithm): the vector is split
// in two halves; half t is reduced up tree t to its root and broadcast back
// down the same tree (dbtree.h). A rank is internal in at most one tree,
// so its links carry about as much as a ring's, at logarithmic depth.
//
//   P = 4       tree 0 (half 0)          tree 1 (half 1)
//                  0                        3
//                  ^ |   up: reduce         ^ |
//                  | v   down: result       | v
//                  2                        1
//                ^/ \^                    ^/ \^
//                1   3                    0   2
//
// Each half is cut into C chunks of at most chunkBytes and pipelined: a
// rank reduces chunk c up while earlier chunks come back down. Both trees
// use one connection per peer pair, on which the engine posts sends in
// schedule order, so the plan lists chunk c's way up together with chunk
// c-L's way down, L = 2 * depth: by the time a rank's chunk c is ready to
// go up, chunk c-L has come down, and a send down never holds up the
// pipeline up on a link the trees share (or the other way round). Every
// rank lists its steps in the same (iteration, tree, direction) order, so
// the k-th message on every link means the same chunk at both ends.
//
// Cost (n bytes, D = tree depth, C chunks of c = n/(2C) bytes per half; as
// for the ring, reduction adds to the transfer, one engine thread doing
// both). The busiest rank sends S chunk messages and reduces R chunks per
// chunk index (S = 4, R = 2 from P = 4 on: one up and two down in its
// internal tree, one up in the other); the first and last chunks add the
// trip through the rest of the depth:
//   T = S C alpha + S (n/2) beta + R (n/2) gamma + (2D - 2)(alpha + c beta),
// about 2D alpha when latency-bound and 2n beta + n gamma when
// bandwidth-bound; the busiest rank sends S n/2 bytes (2n).
#include <algorithm>
#include <cmath>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/dbtree.h"
#include "algorithms/patterns.h"

namespace braid::algo {

Schedule planAllReduceDbtree(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks;
  const size_t es = args.elementSize();
  if (P == 1) return planOwnInput(args);
  const Range half[2] = {evenPart(args.count, 2, 0), evenPart(args.count, 2, 1)};
  const size_t C = chunkCount(half[0].size, std::max<size_t>(1, args.chunkBytes / es));
  const size_t slotBytes = evenPart(half[0].size, C, 0).size * es;
  auto chunk = [&](BufferId buffer, int t, size_t c) {
    Range ch = evenPart(half[t].size, C, c);
    return Slice{buffer, (half[t].begin + ch.begin) * es, ch.size * es};
  };

  DbtreeLinks tree[2];
  size_t slotBase[2] = {0, 0};
  for (int t = 0; t < 2; ++t) {
    tree[t] = dbtreeLinks(P, t, args.rank);
    slotBase[t] = plan.scratchBytes;
    // The first child's chunks are reduced as they arrive, straight into
    // the output, so every receive from it is posted at once: a leaf sends
    // all its chunks without waiting, and one that finds no receive posted
    // is spilled and copied again. The second child's chunk c must wait
    // for the first's (the order of the reduction is fixed), so it lands in
    // one of two slots: chunk c arrives while chunk c-1 is reduced.
    plan.scratchBytes += 2 * (tree[t].childCount() > 1) * slotBytes;
  }
  // reduced[t][i][c]: the reduction that consumed child i's chunk c.
  // upDone[t][c]: chunk c has left for the parent (at the root: is final).
  std::vector<std::vector<StepIndex>> reduced[2], upDone(2, std::vector<StepIndex>(C));
  for (int t = 0; t < 2; ++t) reduced[t].assign(2, std::vector<StepIndex>(C, kNoStep));

  auto up = [&](int t, size_t c) {
    const DbtreeLinks& links = tree[t];
    Slice own = chunk(BufferId::kSend, t, c), acc = chunk(BufferId::kRecv, t, c);
    StepIndex last = kNoStep;
    for (int i = 0; i < links.childCount(); ++i) {
      if (i == 0) {
        last = reduced[t][i][c] = plan.recvReduce(links.children[i], acc, own);
        continue;
      }
      Slice slot{BufferId::kScratch, slotBase[t] + (c % 2) * slotBytes, acc.bytes};
      StepIndex got = plan.recv(links.children[i], slot, c >= 2 ? reduced[t][i][c - 2] : kNoStep);
      last = reduced[t][i][c] = plan.reduce(acc, acc, slot, got, last);
    }
    if (links.parent >= 0) {
      upDone[t][c] = plan.send(links.parent, links.childCount() ? acc : own, last);
    } else {
      upDone[t][c] = args.op == RedOp::kAvg ? plan.average(acc, last) : last;
    }
  };
  auto down = [&](int t, size_t c) {
    const DbtreeLinks& links = tree[t];
    Slice acc = chunk(BufferId::kRecv, t, c);
    // The result overwrites what went up (in place, a leaf's own input).
    StepIndex have = links.parent >= 0 ? plan.recv(links.parent, acc, upDone[t][c]) : upDone[t][c];
    for (int i = 0; i < links.childCount(); ++i) plan.send(links.children[i], acc, have);
  };

  const size_t lag = 2 * static_cast<size_t>(dbtreeDepth(P));
  for (size_t it = 0; it < C + lag; ++it) {
    for (int t = 0; t < 2 && it < C; ++t) up(t, it);
    for (int t = 0; t < 2 && it >= lag; ++t) down(t, it - lag);
  }
  return plan;
}

Cost estimateAllReduceDbtree(const CollectiveArgs& a, const LinkModel& m) {
  Cost cost;
  const int P = a.nranks;
  if (P <= 1) return cost;
  int sends = 0, reduces = 0;  // per chunk index, busiest rank
  for (int r = 0; r < P; ++r) {
    int s = 0, c = 0;
    for (int t = 0; t < 2; ++t) {
      DbtreeLinks links = dbtreeLinks(P, t, r);
      s += (links.parent >= 0) + links.childCount();
      c += links.childCount();
    }
    sends = std::max(sends, s);
    reduces = std::max(reduces, c);
  }
  const int depth = dbtreeDepth(P);
  const double half = std::ceil(a.count / 2.0) * a.elementSize();
  const double chunks = std::max(1.0, std::ceil(half / std::max<size_t>(a.chunkBytes, 1)));
  const double chunk = half / chunks;
  cost.steps = 2 * depth;
  cost.bytesSent = sends * half;
  // Pipelined: every rank is busy throughout.
  cost.seconds = (sends * chunks * m.alpha + sends * half * m.beta + reduces * half * m.gamma +
                  (2 * depth - 2) * (m.alpha + chunk * m.beta)) *
                 m.stretch(P, P);
  return cost;
}

}  // namespace braid::algo
