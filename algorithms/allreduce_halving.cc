// Rabenseifner's AllReduce: a recursive-halving reduce-scatter, then a
// recursive-doubling allgather that replays it backwards, over the p'
// (largest power of two <= P) survivors of the same fold as the butterfly.
// The vector is cut into p' blocks; survivor v ends the reduce-scatter with
// block v fully reduced.
//
//   p' = 4, blocks b0..b3. Reduce-scatter: swap the half given up, reduce
//   the half kept. Allgather: swap everything held, in reverse order.
//
//        reduce-scatter                    allgather
//        d = 2              d = 1          d = 1          d = 2
//   v0   <-> v2: keep b0b1  <-> v1: keep b0  <-> v1: +b1    <-> v2: +b2b3
//   v1   <-> v3: keep b0b1  <-> v0: keep b1  <-> v0: +b0    <-> v3: +b2b3
//   v2   <-> v0: keep b2b3  <-> v3: keep b2  <-> v3: +b3    <-> v0: +b0b1
//   v3   <-> v1: keep b2b3  <-> v2: keep b3  <-> v2: +b2    <-> v1: +b0b1
//
// Non-powers of two: with r = P - p', each even rank below 2r sends its
// vector to the odd rank above it, which reduces and takes part as survivor
// rank/2 (ranks from 2r on are survivors rank - r); at the end the odd
// ranks send the result back. (MPICH's fold, one n-byte message. Open MPI
// splits the fold's reduction across the pair at the price of one more
// message latency; here the reduction already overlaps the transfer cell
// by cell, which leaves little to win.)
//
// Every message is cut on a fixed grid of chunkBytes cells, so a piece of
// round k+1 lies inside one piece of round k and waits only for that one:
// rounds pipeline per cell. Empty ranges (count < p') send nothing, on both
// sides alike. Each block is reduced on one rank only, so all ranks end
// with the same bits.
//
// Cost (p' = 2^k, n bytes, f = 1 when P is not a power of two; as for the
// ring, reduction adds to the transfer, one engine thread doing both):
//   T = 2(k + f) alpha + 2 (p'-1)/p' n beta + (p'-1)/p' n gamma + f n (2 beta + gamma),
// plus one alpha per further chunkBytes piece of a round. The critical path
// runs through an odd survivor, which also sends the most: (2 (p'-1)/p' + f) n.
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/blocks.h"
#include "algorithms/patterns.h"

namespace braid::algo {
namespace {

// The vector's elements on a grid of cells; ranges are cut at cell edges.
class Grid {
 public:
  Grid(size_t count, size_t elementSize, size_t chunkBytes)
      : es_(elementSize), cell_(std::max<size_t>(1, chunkBytes / elementSize)) {
    ready_.assign((count + cell_ - 1) / cell_, kNoStep);
  }
  // Calls f(cell, slice-maker) for each piece of elements [begin, end).
  template <typename F>
  void pieces(size_t begin, size_t end, F f) const {
    for (size_t cell = begin / cell_; begin < end; ++cell) {
      size_t stop = std::min(end, (cell + 1) * cell_);
      f(cell, [=, this](BufferId b) { return Slice{b, begin * es_, (stop - begin) * es_}; });
      begin = stop;
    }
  }
  // The step after which every write so far into Recv within `cell` is done.
  StepIndex ready(size_t cell) const { return ready_[cell]; }
  // Records a write; `ordered` when it already waits for ready(cell).
  void wrote(Schedule& plan, size_t cell, StepIndex step, bool ordered) {
    StepIndex& r = ready_[cell];
    r = ordered || r == kNoStep ? step : plan.copy({}, {}, r, step);
  }

 private:
  size_t es_, cell_;
  std::vector<StepIndex> ready_;
};

}  // namespace

Schedule planAllReduceHalving(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks;
  const size_t n = args.count;
  if (P == 1) return planOwnInput(args);
  const Fold fold(P);
  const int r = args.rank;
  // The other rank of a folded pair (the odd one acts for both); -1 outside.
  const int partner = r < 2 * fold.rem ? (r % 2 ? r - 1 : r + 1) : -1;
  Grid grid(n, args.elementSize(), args.chunkBytes);

  if (fold.folded(r)) {
    std::vector<StepIndex> sent;
    grid.pieces(0, n, [&](size_t, auto piece) {
      sent.push_back(plan.send(partner, piece(BufferId::kSend)));
    });
    size_t i = 0;  // in place, the result overwrites what is being sent
    grid.pieces(0, n,
                [&](size_t, auto piece) { plan.recv(partner, piece(BufferId::kRecv), sent[i++]); });
    return plan;
  }

  // Scratch mirrors Recv: the piece of elements [a, b) arrives at the same
  // offset there, and is reused (ranges only shrink) once reduced.
  plan.scratchBytes = args.bytes();
  BufferId mine = BufferId::kSend;
  if (partner >= 0) {
    grid.pieces(0, n, [&](size_t cell, auto piece) {
      StepIndex got = plan.recv(partner, piece(BufferId::kScratch));
      StepIndex sum = plan.reduce(piece(BufferId::kRecv), piece(BufferId::kScratch),
                                  piece(BufferId::kSend), got);
      grid.wrote(plan, cell, sum, true);
    });
    mine = BufferId::kRecv;
  }
  const int v = fold.newRank(r), pof2 = fold.p2;
  auto at = [&](int block) { return evenPart(n, pof2, block).begin; };  // at(p') == n

  // Reduce-scatter: distance p'/2, p'/4, ..., 1; [lo, hi) is the block
  // range still shared with the partners to come.
  int lo = 0, hi = pof2;
  std::vector<std::vector<StepIndex>> sentAt;  // per round, its pieces
  for (int d = pof2 / 2; d >= 1; d /= 2) {
    const int peer = fold.oldRank(v ^ d);
    const bool lower = (v & d) == 0;
    const int keepLo = lower ? lo : lo + d, sendLo = lower ? lo + d : lo;
    sentAt.emplace_back();
    grid.pieces(at(sendLo), at(sendLo + d), [&](size_t cell, auto piece) {
      sentAt.back().push_back(plan.send(peer, piece(mine), grid.ready(cell)));
    });
    grid.pieces(at(keepLo), at(keepLo + d), [&](size_t cell, auto piece) {
      // Waiting for ready(cell) frees the scratch piece (the last reduction
      // of this cell read it) and orders the reduction after its input.
      StepIndex got = plan.recv(peer, piece(BufferId::kScratch), grid.ready(cell));
      Slice own = piece(mine), theirs = piece(BufferId::kScratch);
      StepIndex sum =
          plan.reduce(piece(BufferId::kRecv), lower ? own : theirs, lower ? theirs : own, got);
      grid.wrote(plan, cell, sum, true);
    });
    mine = BufferId::kRecv;
    lo = keepLo;
    hi = keepLo + d;
  }
  if (args.op == RedOp::kAvg)
    grid.pieces(at(v), at(v + 1), [&](size_t cell, auto piece) {
      grid.wrote(plan, cell, plan.average(piece(BufferId::kRecv), grid.ready(cell)), true);
    });

  // Allgather: distance 1, 2, ..., p'/2; the partner's range is the one
  // this rank sent in the reduce-scatter round of the same distance, and
  // it may be overwritten once that send is done.
  for (int d = 1; d < pof2; d *= 2) {
    const int peer = fold.oldRank(v ^ d);
    const bool lower = (v & d) == 0;
    const int theirLo = lower ? hi : lo - d;
    grid.pieces(at(lo), at(hi), [&](size_t cell, auto piece) {
      plan.send(peer, piece(BufferId::kRecv), grid.ready(cell));
    });
    const std::vector<StepIndex>& freed = sentAt[sentAt.size() - 1 - std::countr_zero(unsigned(d))];
    size_t i = 0;
    grid.pieces(at(theirLo), at(theirLo + d), [&](size_t cell, auto piece) {
      grid.wrote(plan, cell, plan.recv(peer, piece(BufferId::kRecv), freed[i++]), false);
    });
    lo = std::min(lo, theirLo);
    hi = lo + 2 * d;
  }
  if (partner >= 0)
    grid.pieces(0, n, [&](size_t cell, auto piece) {
      plan.send(partner, piece(BufferId::kRecv), grid.ready(cell));
    });
  return plan;
}

Cost estimateAllReduceHalving(const CollectiveArgs& a, const LinkModel& m) {
  Cost cost;
  if (a.nranks <= 1) return cost;
  const Fold fold(a.nranks);
  const double n = static_cast<double>(a.bytes());
  const double cb = static_cast<double>(std::max<size_t>(a.chunkBytes, 1));
  // A round moving `bytes` in pieces of at most chunkBytes, then reducing them.
  auto round = [&](double bytes, bool reduces) {
    return std::max(1.0, std::ceil(bytes / cb)) * m.alpha + bytes * m.beta +
           (reduces ? bytes * m.gamma : 0.0);
  };
  // The fold and unfold keep 2 * rem ranks busy, the exchanges p2.
  int lg = 0;
  for (int d = fold.p2 / 2; d >= 1; d /= 2, ++lg) {
    const double bytes = n * d / fold.p2;
    cost.seconds += (round(bytes, true) + round(bytes, false)) * m.stretch(fold.p2, a.nranks);
    cost.bytesSent += 2 * bytes;
  }
  cost.steps = 2 * lg;
  if (fold.rem > 0) {
    cost.seconds += (round(n, true) + round(n, false)) * m.stretch(2 * fold.rem, a.nranks);
    cost.bytesSent += n;
    cost.steps += 2;
  }
  return cost;
}

}  // namespace braid::algo
