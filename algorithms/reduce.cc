// Reduce for long vectors (Rabenseifner): a ring reduce-scatter leaves the
// fully reduced block v on virtual rank v = rank - root (mod P), then a
// binomial gather brings the blocks to the root. Every rank reduces only
// n/P of the vector, where the binomial tree makes the root reduce all of
// it log2(P) times.
//
//   reduce-scatter, step s: v sends block v-s-1 and receives block v-s-2,
//   which it combines with its own; after P-1 steps it holds block v.
//
//      v0 --b3--> v1 --b0--> v2 --b1--> v3 --b2--> v0          (s = 0, P = 4)
//
//   gather: v receives its children's blocks next to its own and passes the
//   contiguous run [v, v + subtree) up; inner ranks keep it in scratch.
//
//      v3 --b3--> v2 --b2 b3--> v0 <--b1-- v1
//
// Blocks are chunked as in the ring, so sending, receiving and reducing
// overlap; incoming chunks and partial sums use two alternating slots each.
//
//   time (P-1) C (alpha + (n/(P C)) max(beta, gamma))   (ring, C chunks a block;
//        every link carries P-1 blocks, reduction overlapping transfer)
//      + ceil(log2 P) alpha + (P-1)/P n beta           (gather)
#include <algorithm>
#include <cmath>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/blocks.h"
#include "algorithms/patterns.h"

namespace braid::algo {
Schedule planReduceScatterGather(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, root = args.root;
  const int v = modRank(args.rank - root, P);
  if (P == 1) return planOwnInput(args);
  auto real = [&](int virt) { return modRank(virt + root, P); };
  const VectorBlocks blocks(args.count, P, args.elementSize(), args.chunkBytes);
  const size_t C = blocks.chunks();
  const int subtree = subtreeSize(v, P);

  // The area that collects blocks [v, v + subtree) in vector layout: the
  // root's Recv buffer; scratch elsewhere, since non-roots have no Recv.
  const size_t areaBase = blocks.range(BufferId::kRecv, v, 1).offset;
  const size_t areaBytes = v == 0 ? 0 : blocks.range(BufferId::kRecv, v, subtree).bytes;
  auto area = [&](Slice s) {
    if (v != 0) s = {BufferId::kScratch, s.offset - areaBase, s.bytes};
    return s;
  };
  const size_t slotBytes = blocks.maxBlockBytes();
  auto incomingSlot = [&](int s) { return areaBytes + (s % 2) * slotBytes; };
  auto partialSlot = [&](int s) { return areaBytes + (2 + s % 2) * slotBytes; };
  plan.scratchBytes = areaBytes + 4 * slotBytes;

  // In place, the root's Send is its Recv: a gathered block may land only
  // once the ring has read the root's own contribution to it.
  const bool guardReads = v == 0 && args.inPlace;
  std::vector<std::vector<StepIndex>> readers(guardReads ? P : 0);

  const int next = real(v + 1), prev = real(v - 1);
  StepGrid reduced(P - 1, std::vector<StepIndex>(C)), sent(P - 1, std::vector<StepIndex>(C));
  for (int s = 0; s < P - 1; ++s) {
    const int sendBlock = modRank(v - s - 1, P), recvBlock = modRank(v - s - 2, P);
    const bool last = s == P - 2;
    for (size_t c = 0; c < C; ++c) {
      Slice size = blocks.chunk(BufferId::kSend, sendBlock, c);
      Slice src = s == 0 ? size : blocks.slot(partialSlot(s - 1), c, size.bytes);
      sent[s][c] = plan.send(next, src, at(reduced, s - 1, c));
      if (guardReads && s == 0) readers[sendBlock].push_back(sent[s][c]);
    }
    for (size_t c = 0; c < C; ++c) {
      Slice mine = blocks.chunk(BufferId::kSend, recvBlock, c);
      Slice incoming = blocks.slot(incomingSlot(s), c, mine.bytes);
      StepIndex got = plan.recv(prev, incoming, at(reduced, s - 2, c));
      Slice dst = last ? area(blocks.chunk(BufferId::kRecv, v, c))
                       : blocks.slot(partialSlot(s), c, mine.bytes);
      // The partial-sum slot is free once the send that read it is done.
      reduced[s][c] = plan.reduce(dst, incoming, mine, got, at(sent, s - 1, c));
      if (guardReads) readers[recvBlock].push_back(reduced[s][c]);
    }
  }

  std::vector<StepIndex> ready(C);
  for (size_t c = 0; c < C; ++c) {
    ready[c] = reduced[P - 2][c];
    // Each rank averages its own block: the division is spread over all ranks.
    if (args.op == RedOp::kAvg)
      ready[c] = plan.average(area(blocks.chunk(BufferId::kRecv, v, c)), ready[c]);
  }
  for (int m : binomialChildOffsets(v, P)) {
    const int child = v + m, size = subtreeSize(child, P);
    StepIndex guard = kNoStep;
    if (guardReads) {
      std::vector<StepIndex> reads;
      for (int b = child; b < child + size; ++b)
        reads.insert(reads.end(), readers[b].begin(), readers[b].end());
      guard = joinSteps(plan, reads);
    }
    ready.push_back(
        plan.recv(real(child), area(blocks.range(BufferId::kRecv, child, size)), guard));
  }
  if (v != 0)
    plan.send(real(binomialParent(v)), area(blocks.range(BufferId::kRecv, v, subtree)),
              joinSteps(plan, ready));
  return plan;
}

// The root finishes last: the ring, then the gather's log2(P) messages that
// bring it the other (P-1)/P of the vector. Its largest child sends the most.
Cost estimateReduceScatterGather(const CollectiveArgs& a, const LinkModel& m) {
  Cost c;
  const int P = a.nranks;
  if (P == 1) return c;
  const double block = static_cast<double>(a.bytes()) / P;
  const double chunks = std::max(1.0, std::ceil(block / std::max<size_t>(a.chunkBytes, 1)));
  const int lg = ceilLog2(P);
  c.steps = P - 1 + lg;
  c.bytesSent = (P - 1) * block + (P - floorPow2(P - 1)) * block;
  c.seconds = (P - 1) * chunks * (m.alpha + block / chunks * std::max(m.beta, m.gamma)) +
              lg * m.alpha + (P - 1) * block * m.beta;
  return c;
}

}  // namespace braid::algo
