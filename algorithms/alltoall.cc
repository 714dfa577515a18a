// Bruck's AllToAll, for short messages: ceil(log2 P) rounds instead of the
// pairwise algorithm's P-1, at the price of sending each block up to
// log2(P) times.
//
// Scratch W is the Send buffer rotated by the rank, so W[i] holds the block
// bound for rank r+i: it must travel i ranks to the right. In round k every
// block whose index has bit k set moves 2^k ranks on: those runs of W are
// packed into a staging area, sent to r + 2^k in one message, and what
// arrives from r - 2^k is unpacked into the same positions. Afterwards W[i]
// holds the block that rank r-i sent to r, and a final rotation (reversing
// the order) puts it into Recv block r-i.
//
//    P = 5, rank r:  W = [r->r, r->r+1, r->r+2, r->r+3, r->r+4]
//    round 0 (bit 0): positions 1 3    go to r+1
//    round 1 (bit 1): positions 2 3    go to r+2
//    round 2 (bit 2): position  4      goes to r+4
//    Recv[r-i] = W[i]
//
//   time ceil(log2 P) alpha + sum_k |{i : bit k of i}| count beta
//        ~ log2(P) (alpha + (N/2) beta), N = P count bytes,
//   plus local passes over N for the rotations and the packing.
#include <algorithm>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/blocks.h"
#include "algorithms/patterns.h"

namespace braid::algo {
namespace {

// Positions in [0, P) with bit `bit` set, as runs [begin, end).
std::vector<Range> runsWithBit(int P, int bit) {
  std::vector<Range> runs;
  for (int start = bit; start < P; start += 2 * bit)
    runs.push_back(
        {static_cast<size_t>(start), static_cast<size_t>(std::min(start + bit, P) - start)});
  return runs;
}

int countWithBit(int P, int bit) {
  int n = 0;
  for (const Range& run : runsWithBit(P, bit)) n += static_cast<int>(run.size);
  return n;
}

}  // namespace

Schedule planAllToAllBruck(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, r = args.rank;
  const size_t bb = args.bytes();
  if (P == 1) {
    plan.copy({BufferId::kRecv, 0, bb}, {BufferId::kSend, 0, bb});
    return plan;
  }
  int most = 0;
  for (int bit = 1; bit < P; bit *= 2) most = std::max(most, countWithBit(P, bit));
  const size_t sendStage = P * bb, recvStage = sendStage + most * bb;
  plan.scratchBytes = recvStage + most * bb;
  auto w = [&](size_t first, size_t n) { return blockRange(BufferId::kScratch, first, n, bb); };
  auto send = [&](int first, int n) { return blockRange(BufferId::kSend, first, n, bb); };

  StepIndex head = plan.copy(w(0, P - r), send(r, P - r));
  StepIndex tail = r > 0 ? plan.copy(w(P - r, r), send(0, r)) : kNoStep;
  // Rounds run one after another: round k+1 forwards what round k brought.
  StepIndex roundDone = joinSteps(plan, {head, tail});
  for (int bit = 1; bit < P; bit *= 2) {
    const std::vector<Range> runs = runsWithBit(P, bit);
    std::vector<StepIndex> packed;
    size_t at = 0;
    for (const Range& run : runs) {
      packed.push_back(plan.copy(blockRange(BufferId::kScratch, at, run.size, bb, sendStage),
                                 w(run.begin, run.size), roundDone));
      at += run.size;
    }
    const int n = static_cast<int>(at);
    StepIndex sent =
        plan.send(modRank(r + bit, P), blockRange(BufferId::kScratch, 0, n, bb, sendStage),
                  joinSteps(plan, packed));
    StepIndex got = plan.recv(modRank(r - bit, P),
                              blockRange(BufferId::kScratch, 0, n, bb, recvStage), roundDone);
    std::vector<StepIndex> done = {sent};
    at = 0;
    for (size_t j = 0; j < runs.size(); ++j) {
      // A position may be overwritten once its old block is packed.
      done.push_back(plan.copy(w(runs[j].begin, runs[j].size),
                               blockRange(BufferId::kScratch, at, runs[j].size, bb, recvStage), got,
                               packed[j]));
      at += runs[j].size;
    }
    roundDone = joinSteps(plan, done);
  }
  for (int i = 0; i < P; ++i)
    plan.copy(blockRange(BufferId::kRecv, modRank(r - i, P), 1, bb), w(i, 1), roundDone);
  return plan;
}

Cost estimateAllToAllBruck(const CollectiveArgs& a, const LinkModel& m) {
  Cost c;
  const int P = a.nranks;
  const double bb = static_cast<double>(a.bytes());
  for (int bit = 1; bit < P; bit *= 2) {
    ++c.steps;
    c.bytesSent += countWithBit(P, bit) * bb;
  }
  // Plus the two rotations and the packing and unpacking of every round:
  // local passes priced like a reduction pass.
  c.seconds = c.steps * m.alpha + c.bytesSent * m.beta + (2 * P * bb + 2 * c.bytesSent) * m.gamma;
  return c;
}

}  // namespace braid::algo
