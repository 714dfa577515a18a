// Recursive-doubling ("butterfly") AllReduce: in round k every rank swaps
// its whole vector with the rank 2^k away and reduces, so after lg P rounds
// every rank holds the full result. The fewest rounds of any AllReduce, at
// n bytes per round: the algorithm for latency-bound sizes.
//
//   P = 6: p' = 4 survivors, r = 2 folded pairs (new ranks in brackets)
//
//     fold       round 0 (mask 1)   round 1 (mask 2)     unfold
//   0 --> 1[0]   1[0] <-> 3[1]      1[0] <-> 4[2]        1 --> 0
//   2 --> 3[1]   4[2] <-> 5[3]      3[1] <-> 5[3]        3 --> 2
//
// Non-powers of two are folded: with p' the largest power of two <= P and
// r = P - p', each even rank below 2r hands its vector to the odd rank
// above it and waits; the p' survivors run the butterfly and the odd ranks
// hand the result back. Each chunk of the vector (chunkBytes) moves on its
// own, so round k+1 of chunk c overlaps round k of chunk c+1.
//
// Both partners of a round compute "lower group's data op higher group's
// data", the same expression, so every rank ends with the same bits even
// where the op is not associative in floating point.
//
// Cost with n bytes in C chunk messages per round, f = 1 when P is not a
// power of two, and (as for the ring) reduction adding to the transfer
// because one engine thread does both. The critical path runs through an
// odd survivor: it waits for the fold, then lg p' rounds, then the unfold:
//   T = (lg p' + 2f) (C alpha + n beta) + (lg p' + f) n gamma;
// it sends (lg p' + f) n bytes, the most of any rank.
#include <algorithm>
#include <cmath>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/blocks.h"
#include "algorithms/patterns.h"

namespace braid::algo {

Schedule planAllReduceButterfly(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks;
  const size_t es = args.elementSize();
  if (P == 1) return planOwnInput(args);
  const size_t C = chunkCount(args.count, std::max<size_t>(1, args.chunkBytes / es));
  auto chunk = [&](BufferId buffer, size_t c) {
    Range ch = evenPart(args.count, C, c);
    return Slice{buffer, ch.begin * es, ch.size * es};
  };
  const Fold fold(P);
  const int r = args.rank;
  // The other rank of a folded pair (the odd one acts for both); -1 outside.
  const int partner = r < 2 * fold.rem ? (r % 2 ? r - 1 : r + 1) : -1;

  if (fold.folded(r)) {
    // Folded even rank: hand the vector over, take the result back. In
    // place the result lands where the vector was, so only after its send.
    std::vector<StepIndex> sent(C);
    for (size_t c = 0; c < C; ++c) sent[c] = plan.send(partner, chunk(BufferId::kSend, c));
    for (size_t c = 0; c < C; ++c) plan.recv(partner, chunk(BufferId::kRecv, c), sent[c]);
    return plan;
  }

  // One scratch copy of the vector holds the partner's chunks; chunk c is
  // free again once the previous round's reduction of chunk c has read it.
  plan.scratchBytes = args.bytes();
  std::vector<StepIndex> last(C, kNoStep);  // the latest write of Recv chunk c
  BufferId mine = BufferId::kSend;          // where this rank's partial result is
  if (partner >= 0) {
    for (size_t c = 0; c < C; ++c) {
      StepIndex got = plan.recv(partner, chunk(BufferId::kScratch, c));
      last[c] = plan.reduce(chunk(BufferId::kRecv, c), chunk(BufferId::kScratch, c),
                            chunk(BufferId::kSend, c), got);
    }
    mine = BufferId::kRecv;
  }
  const int v = fold.newRank(r);
  std::vector<StepIndex> sent(C);
  for (int mask = 1; mask < fold.p2; mask <<= 1) {
    const int peer = fold.oldRank(v ^ mask);
    const bool lower = (v & mask) == 0;
    for (size_t c = 0; c < C; ++c) sent[c] = plan.send(peer, chunk(mine, c), last[c]);
    for (size_t c = 0; c < C; ++c) {
      Slice own = chunk(mine, c), theirs = chunk(BufferId::kScratch, c);
      StepIndex got = plan.recv(peer, theirs, last[c]);
      // Waiting for the send as well: in place, own is the Recv chunk.
      last[c] = plan.reduce(chunk(BufferId::kRecv, c), lower ? own : theirs, lower ? theirs : own,
                            got, sent[c]);
    }
    mine = BufferId::kRecv;
  }
  for (size_t c = 0; c < C; ++c) {
    if (args.op == RedOp::kAvg) last[c] = plan.average(chunk(BufferId::kRecv, c), last[c]);
    if (partner >= 0) plan.send(partner, chunk(BufferId::kRecv, c), last[c]);
  }
  return plan;
}

Cost estimateAllReduceButterfly(const CollectiveArgs& a, const LinkModel& m) {
  Cost cost;
  if (a.nranks <= 1) return cost;
  const Fold fold(a.nranks);
  const int lg = ceilLog2(fold.p2);
  const int f = fold.rem > 0 ? 1 : 0;
  const double bytes = static_cast<double>(a.bytes());
  const double chunks = std::max(1.0, std::ceil(bytes / std::max<size_t>(a.chunkBytes, 1)));
  const int rounds = lg + 2 * f;  // the fold's and the unfold's transfers are on the path
  cost.steps = rounds;
  cost.bytesSent = (lg + f) * bytes;
  // The fold and unfold keep 2 * rem ranks busy, the exchanges p2.
  const double round = chunks * m.alpha + bytes * m.beta;
  cost.seconds = 2 * f * (round + 0.5 * bytes * m.gamma) * m.stretch(2 * fold.rem, a.nranks) +
                 lg * (round + bytes * m.gamma) * m.stretch(fold.p2, a.nranks);
  return cost;
}

}  // namespace braid::algo
