// AllGather in a logarithmic number of rounds, for short messages, where the
// ring's P-1 latencies dominate. Blocks are `count` elements, in rank order.
//
// doubling: recursive doubling over p2 = the largest power of two <= P.
// Round k pairs new ranks q and q ^ 2^k, which swap everything they hold:
// an aligned run of 2^k new ranks' blocks, contiguous in Recv, so each
// round is one message that lands where it belongs. With rem = P - p2 > 0,
// ranks 2i and 2i+1 (i < rem) fold first: 2i hands its block to 2i+1,
// which takes part for both, and gets the whole result back at the end.
//
//    fold        rounds (new ranks 0..3)        unfold       (P = 6, rem = 2)
//    0 --b0--> 1   q0 <-> q1, then q0 <-> q2    1 --all--> 0
//    2 --b2--> 3   q2 <-> q3, then q1 <-> q3    3 --all--> 2
//
//   time log2(p2) alpha + (p2-1)/p2 N beta, N = P count bytes
//        + (rem > 0): 2 alpha + (count + N) beta for the fold.
//
// bruck: ceil(log2 P) rounds for any P. Scratch W holds W[i] = block r+i;
// round k sends W[0, cnt) to r - 2^k and receives W[2^k, 2^k + cnt) from
// r + 2^k, cnt = min(2^k, P - 2^k). A final local rotation puts W[i] into
// Recv block r+i.
//
//    round 0: W = [r]          -> [r, r+1]
//    round 1: W = [r, r+1]     -> [r, r+1, r+2, r+3]
//    ...      then  Recv = rotate(W, r)
//
//   time ceil(log2 P) alpha + (P-1) count beta, plus one local pass over N.
#include <algorithm>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/blocks.h"
#include "algorithms/patterns.h"

namespace braid::algo {

Schedule planAllGatherDoubling(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, r = args.rank;
  const size_t bb = args.bytes();
  const Slice own =
      args.inPlace ? blockRange(BufferId::kRecv, r, 1, bb) : Slice{BufferId::kSend, 0, bb};
  const Slice all = blockRange(BufferId::kRecv, 0, P, bb);
  if (P == 1) {
    if (!args.inPlace) plan.copy(all, own);
    return plan;
  }
  const Fold fold(P);
  if (fold.folded(r)) {
    StepIndex sent = plan.send(r + 1, own);
    // In place the result overwrites the block being sent.
    plan.recv(r + 1, all, args.inPlace ? sent : kNoStep);
    return plan;
  }
  StepIndex got = kNoStep, sent = kNoStep;
  if (!args.inPlace) sent = plan.copy(blockRange(BufferId::kRecv, r, 1, bb), own);
  if (r < 2 * fold.rem) got = plan.recv(r - 1, blockRange(BufferId::kRecv, r - 1, 1, bb));

  auto run = [&](int q, int d) {
    const int lo = q & ~(d - 1);
    const int first = fold.origBegin(lo);
    return blockRange(BufferId::kRecv, first, fold.origBegin(lo + d) - first, bb);
  };
  const int q = fold.newRank(r);
  for (int d = 1; d < fold.p2; d *= 2) {
    const int partner = q ^ d;
    // Waiting for the previous send as well makes every earlier receive,
    // whose data this run includes, a predecessor.
    sent = plan.send(fold.oldRank(partner), run(q, d), got, sent);
    got = plan.recv(fold.oldRank(partner), run(partner, d));
  }
  if (r < 2 * fold.rem) plan.send(r - 1, all, got, sent);
  return plan;
}

Schedule planAllGatherBruck(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, r = args.rank;
  const size_t bb = args.bytes();
  const Slice own =
      args.inPlace ? blockRange(BufferId::kRecv, r, 1, bb) : Slice{BufferId::kSend, 0, bb};
  if (P == 1) {
    if (!args.inPlace) plan.copy(blockRange(BufferId::kRecv, 0, 1, bb), own);
    return plan;
  }
  plan.scratchBytes = P * bb;
  auto w = [&](int first, int n) { return blockRange(BufferId::kScratch, first, n, bb); };
  StepIndex got = plan.copy(w(0, 1), own), sent = kNoStep;
  for (int d = 1; d < P; d *= 2) {
    const int cnt = std::min(d, P - d);
    sent = plan.send(modRank(r - d, P), w(0, cnt), got, sent);
    got = plan.recv(modRank(r + d, P), w(d, cnt));
  }
  StepIndex done = joinSteps(plan, {got, sent});
  plan.copy(blockRange(BufferId::kRecv, r, P - r, bb), w(0, P - r), done);
  if (r > 0) plan.copy(blockRange(BufferId::kRecv, 0, r, bb), w(P - r, r), done);
  return plan;
}

// The folded pairs' partner ranks are the slowest: their runs hold up to
// two blocks per new rank, and they send the whole result back.
Cost estimateAllGatherDoubling(const CollectiveArgs& a, const LinkModel& m) {
  Cost c;
  const int P = a.nranks;
  if (P == 1) return c;
  const Fold fold(P);
  const double bb = static_cast<double>(a.bytes());
  double bytes = 0;
  for (int d = 1; d < fold.p2; d *= 2) {
    bytes += (d + std::min(d, fold.rem)) * bb;
    ++c.steps;
  }
  c.seconds = c.steps * m.alpha + bytes * m.beta;
  if (fold.rem > 0) {
    c.steps += 2;
    c.seconds += 2 * m.alpha + (1 + P) * bb * m.beta;
    bytes += P * bb;
  }
  c.bytesSent = bytes;
  return c;
}

Cost estimateAllGatherBruck(const CollectiveArgs& a, const LinkModel& m) {
  Cost c;
  const int P = a.nranks;
  if (P == 1) return c;
  const double bb = static_cast<double>(a.bytes());
  c.steps = ceilLog2(P);
  c.bytesSent = (P - 1) * bb;
  // Plus the copy into scratch and the final rotation: two local passes
  // over P blocks, priced like a reduction pass.
  c.seconds = c.steps * m.alpha + c.bytesSent * m.beta + 2 * P * bb * m.gamma;
  return c;
}

}  // namespace braid::algo
