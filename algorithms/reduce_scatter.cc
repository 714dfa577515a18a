// ReduceScatter by recursive halving, for short and medium vectors: log2
// rounds where the ring needs P-1. Block b (count elements) of every rank's
// Send buffer is reduced onto rank b.
//
// Over p2 = the largest power of two <= P "new ranks": in the round of
// distance d (p2/2, ..., 1), new rank q keeps the half of its current window
// of 2d new ranks' blocks that contains its own, sends the other half to
// q ^ d and reduces what q ^ d sends for its half. New ranks' blocks are
// contiguous in the Send layout, so each round is one message. With
// rem = P - p2 > 0, ranks 2i and 2i+1 (i < rem) fold first: 2i sends its
// whole vector to 2i+1, which acts for both (new rank i owns blocks 2i
// and 2i+1) and sends block 2i back at the end.
//
//    P = 4:   d = 2:  q0 --b2 b3--> q2, q2 --b0 b1--> q0   (likewise q1, q3)
//             d = 1:  q0 --b1--> q1, q1 --b0--> q0         (likewise q2, q3)
//
//    P = 6:   fold 0 --all--> 1, 2 --all--> 3; ranks 1, 3, 4, 5 are new ranks
//             0-3 and own blocks 0-1, 2-3, 4, 5; then 1 --b0--> 0, 3 --b2--> 2
//
//   time log2(p2) alpha + (p2-1)/p2 N (beta + gamma), N = P count bytes
//        + (rem > 0): 2 alpha + N (beta + gamma) + count beta for the fold.
#include <algorithm>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/blocks.h"
#include "algorithms/patterns.h"

namespace braid::algo {

Schedule planReduceScatterHalving(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, r = args.rank;
  const size_t bb = args.bytes();
  const Slice result{BufferId::kRecv, 0, bb};
  const Slice everything = blockRange(BufferId::kSend, 0, P, bb);
  const bool average = args.op == RedOp::kAvg;
  if (P == 1) {
    if (!args.inPlace) plan.copy(result, everything);
    return plan;
  }
  const Fold fold(P);
  if (fold.folded(r)) {
    StepIndex sent = plan.send(r + 1, everything);
    // In place the result overwrites block r of what is being sent.
    StepIndex got = plan.recv(r + 1, result, args.inPlace ? sent : kNoStep);
    if (average) plan.average(result, got);
    return plan;
  }

  // Scratch: the running sums in the Send layout, then the incoming half.
  const size_t incomingBase = P * bb;
  size_t incomingBytes = 0;
  bool inAcc = false;  // whether the running sums have left the Send buffer
  auto current = [&](int first, int n) {
    return blockRange(inAcc ? BufferId::kScratch : BufferId::kSend, first, n, bb);
  };
  StepIndex last = kNoStep;  // the latest step that wrote the running sums
  if (r < 2 * fold.rem) {
    const Slice acc = blockRange(BufferId::kScratch, 0, P, bb);
    StepIndex got = plan.recv(r - 1, acc);
    last = plan.reduce(acc, acc, everything, got);
    inAcc = true;
  }

  const int q = fold.newRank(r);
  StepIndex final = kNoStep;
  for (int d = fold.p2 / 2; d >= 1; d /= 2) {
    const int lo = q & ~(2 * d - 1);
    const int mineLo = q & d ? lo + d : lo, otherLo = q & d ? lo : lo + d;
    const int mine = fold.origBegin(mineLo), mineN = fold.origBegin(mineLo + d) - mine;
    const int other = fold.origBegin(otherLo), otherN = fold.origBegin(otherLo + d) - other;
    const int peer = fold.oldRank(q ^ d);
    plan.send(peer, current(other, otherN), last);
    incomingBytes = std::max(incomingBytes, mineN * bb);
    // The incoming slot is free once the previous round's reduction read it.
    StepIndex got =
        plan.recv(peer, blockRange(BufferId::kScratch, 0, mineN, bb, incomingBase), last);
    auto incoming = [&](int block) {
      return blockRange(BufferId::kScratch, block - mine, 1, bb, incomingBase);
    };
    if (d > 1) {
      const Slice dst = blockRange(BufferId::kScratch, mine, mineN, bb);
      last = plan.reduce(dst, blockRange(BufferId::kScratch, 0, mineN, bb, incomingBase),
                         current(mine, mineN), got, last);
      inAcc = true;
      continue;
    }
    // Last round: this rank's block goes straight to Recv; a folded
    // partner's block is finished in scratch and sent back.
    if (mineN == 2) {
      const int theirs = r - 1;
      const Slice dst = blockRange(BufferId::kScratch, theirs, 1, bb);
      StepIndex done = plan.reduce(dst, incoming(theirs), current(theirs, 1), got, last);
      plan.send(theirs, dst, done);
    }
    final = plan.reduce(result, incoming(r), current(r, 1), got, last);
  }
  plan.scratchBytes = incomingBase + incomingBytes;
  if (average) plan.average(result, final);
  return plan;
}

// The partner of a fold is the slowest rank: it waits for a whole vector,
// reduces it, and its half-windows hold up to two blocks per new rank.
Cost estimateReduceScatterHalving(const CollectiveArgs& a, const LinkModel& m) {
  Cost c;
  const int P = a.nranks;
  if (P == 1) return c;
  const Fold fold(P);
  const double bb = static_cast<double>(a.bytes());
  double bytes = 0;
  for (int d = fold.p2 / 2; d >= 1; d /= 2) {
    bytes += (d + std::min(d, fold.rem)) * bb;
    ++c.steps;
  }
  c.seconds = c.steps * m.alpha + bytes * (m.beta + m.gamma);
  c.bytesSent = bytes;
  if (fold.rem > 0) {
    c.steps += 2;
    c.seconds += 2 * m.alpha + P * bb * (m.beta + m.gamma) + bb * m.beta;
    c.bytesSent = std::max(P * bb, bytes + bb);
  }
  return c;
}

}  // namespace braid::algo
