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

  // Each exchange combines the incoming chunk as it arrives (RecvReduce)
  // into the buffer this rank is not sending from, so no received byte is
  // written to scratch and read back: the partial result moves between Recv
  // and Scratch, one round to the next. Reducing into the buffer being sent
  // must wait for the send, so the receive went to scratch first: 5n bytes
  // of memory traffic a round where this has 3n, and at 3 ranks on 2 cores
  // 10-20% slower from 64 KiB to 1 MiB (docs/ALGORITHMS.md). The first
  // target is picked so that the last round lands in Recv; only when this
  // rank's own vector starts in Recv (in place, without a fold) and the
  // rounds are odd does a final copy move it there.
  plan.scratchBytes = args.bytes();
  const int v = fold.newRank(r);
  const int lg = ceilLog2(fold.p2);
  auto other = [](BufferId b) {
    return b == BufferId::kRecv ? BufferId::kScratch : BufferId::kRecv;
  };
  // Targets alternate, so an odd count of rounds starts where it ends.
  const BufferId lastTarget = BufferId::kRecv;
  const BufferId firstTarget = lg % 2 ? lastTarget : other(lastTarget);
  std::vector<StepIndex> last(C, kNoStep);  // the step that wrote `mine` chunk c
  // The latest send from Recv and from Scratch of chunk c: a buffer is
  // written again only once its previous contents are on their way.
  std::vector<StepIndex> sentFromRecv(C, kNoStep), sentFromScratch(C, kNoStep);
  auto sentFrom = [&](BufferId b) -> std::vector<StepIndex>& {
    return b == BufferId::kRecv ? sentFromRecv : sentFromScratch;
  };
  BufferId mine = BufferId::kSend;  // where this rank's partial result is
  if (partner >= 0) {
    // The fold: the partner's vector combined with this rank's, into the
    // buffer that makes the rounds end in Recv.
    const BufferId target = lg % 2 ? other(lastTarget) : lastTarget;
    for (size_t c = 0; c < C; ++c)
      last[c] = plan.recvReduce(partner, chunk(target, c), chunk(BufferId::kSend, c));
    mine = target;
  }
  for (int mask = 1; mask < fold.p2; mask <<= 1) {
    const int peer = fold.oldRank(v ^ mask);
    // Both ranks compute lower op upper, so that they agree to the bit.
    const bool lower = (v & mask) == 0;
    // In place, Send is Recv: a first round from it writes Scratch.
    const bool ownInRecv = mine == BufferId::kRecv || (mine == BufferId::kSend && args.inPlace);
    const BufferId target =
        mine == BufferId::kSend ? (ownInRecv ? BufferId::kScratch : firstTarget) : other(mine);
    for (size_t c = 0; c < C; ++c) {
      const StepIndex sent = plan.send(peer, chunk(mine, c), last[c]);
      if (mine != BufferId::kSend || args.inPlace)
        sentFrom(ownInRecv ? BufferId::kRecv : BufferId::kScratch)[c] = sent;
    }
    for (size_t c = 0; c < C; ++c)
      last[c] = lower ? plan.recvReduce(peer, chunk(target, c), chunk(mine, c), last[c],
                                        sentFrom(target)[c])
                      : plan.recvReduceIncomingFirst(peer, chunk(target, c), chunk(mine, c),
                                                     last[c], sentFrom(target)[c]);
    mine = target;
  }
  for (size_t c = 0; c < C; ++c) {
    if (mine != BufferId::kRecv && mine != BufferId::kSend)
      last[c] = plan.copy(chunk(BufferId::kRecv, c), chunk(mine, c), last[c], sentFromRecv[c]);
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
