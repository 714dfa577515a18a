// Broadcast for long vectors, over virtual ranks v = rank - root (mod P).
//
// chain: a pipelined chain. The vector is cut into C chunks of at most
// chunkBytes; v forwards chunk c to v+1 as soon as it has it, so after the
// pipeline fills every link carries a chunk at once.
//
//    root --c2 c1 c0--> v1 --c1 c0--> v2 --c0--> v3      (C = 3, P = 4)
//
//   time (P-1 + C-1) * (alpha + (n/C) beta): bandwidth-optimal once C >> P,
//   but the latency term grows with P.
//
// scatter_allgather (van de Geijn): the vector is cut into P blocks; a
// binomial scatter leaves block v on virtual rank v (an inner rank receives
// its whole subtree's blocks and passes the children theirs), then a ring
// allgather over v -> v+1 completes every copy, chunked like the ring.
//
//    scatter (P = 4):   root --b2 b3--> v2 --b3--> v3
//                       root --b1-----> v1
//    allgather:         v0 -> v1 -> v2 -> v3 -> v0, P-1 steps of one block
//
//   time ceil(log2 P) alpha + (P-1)/P n beta        (scatter)
//      + (P-1) C (alpha + (n/(P C)) beta)           (ring, C chunks a block:
//   every link carries P-1 blocks, so chunking the ring does not shorten it)
//   about 2n beta for large n, against the binomial tree's log2(P) n beta.
#include <algorithm>
#include <cmath>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/blocks.h"
#include "algorithms/patterns.h"

namespace braid::algo {
namespace {

Slice elements(BufferId buffer, size_t begin, size_t size, size_t es) {
  return {buffer, begin * es, size * es};
}

}  // namespace

Schedule planBroadcastChain(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks;
  const int v = modRank(args.rank - args.root, P);
  const int next = modRank(args.rank + 1, P), prev = modRank(args.rank - 1, P);
  const size_t es = args.elementSize();
  const size_t C = chunkCount(args.count, std::max<size_t>(1, args.chunkBytes / es));
  for (size_t c = 0; c < C; ++c) {
    Range ch = evenPart(args.count, C, c);
    Slice mine = elements(BufferId::kRecv, ch.begin, ch.size, es);
    if (v == 0) {
      // The root sends from its Send buffer, so the copy does not delay the chain.
      Slice src = elements(BufferId::kSend, ch.begin, ch.size, es);
      if (!args.inPlace) plan.copy(mine, src);
      if (P > 1) plan.send(next, src);
    } else {
      StepIndex got = plan.recv(prev, mine);
      if (v < P - 1) plan.send(next, mine, got);
    }
  }
  return plan;
}

Schedule planBroadcastScatterAllGather(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, root = args.root;
  const int v = modRank(args.rank - root, P);
  const size_t es = args.elementSize();
  if (P == 1) {
    if (!args.inPlace)
      plan.copy({BufferId::kRecv, 0, args.bytes()}, {BufferId::kSend, 0, args.bytes()});
    return plan;
  }
  const VectorBlocks blocks(args.count, P, es, args.chunkBytes);
  const size_t C = blocks.chunks();
  auto real = [&](int virt) { return modRank(virt + root, P); };

  if (P == 2) {
    // The ring's half into the root would be the half the root scattered:
    // the root only sends (block 1, then block 0, whole: a transport that
    // copies a large message at both ends then has the root's core copy
    // too), and its own copy, out of place, runs while they are on the wire. (64 MiB over
    // shared memory: 1.5x the busbw of the full ring.) With more ranks the
    // root's ring receives pace it: without them it ran ahead of its
    // receivers, and 3 ranks sharing 2 cores broadcast 1 MiB 4x slower, as
    // the chain, whose root only sends, does there too.
    const int peer = real(1 - v);
    if (v == 0) {
      const BufferId from = args.inPlace ? BufferId::kRecv : BufferId::kSend;
      plan.send(peer, blocks.range(from, 1, 1));
      plan.send(peer, blocks.range(from, 0, 1));
      if (!args.inPlace)
        plan.copy({BufferId::kRecv, 0, args.bytes()}, {BufferId::kSend, 0, args.bytes()});
    } else {
      plan.recv(peer, blocks.range(BufferId::kRecv, 1, 1));
      plan.recv(peer, blocks.range(BufferId::kRecv, 0, 1));
    }
    return plan;
  }

  // Scatter. scatterSend[b]: the send that reads block b here; the ring
  // may overwrite block b (with the same values) only after it.
  std::vector<StepIndex> scatterSend(P, kNoStep);
  StepIndex own = kNoStep;  // block v is in Recv
  const BufferId from = v == 0 ? BufferId::kSend : BufferId::kRecv;
  if (v == 0) {
    if (!args.inPlace)
      own = plan.copy(blocks.range(BufferId::kRecv, 0, 1), blocks.range(BufferId::kSend, 0, 1));
  } else {
    own = plan.recv(real(binomialParent(v)), blocks.range(BufferId::kRecv, v, subtreeSize(v, P)));
  }
  for (int m : binomialChildOffsets(v, P)) {
    const int child = v + m, size = subtreeSize(child, P);
    StepIndex sent = plan.send(real(child), blocks.range(from, child, size), own);
    // Out of place the root reads Send, which the ring never writes.
    if (v != 0 || args.inPlace)
      for (int b = child; b < child + size; ++b) scatterSend[b] = sent;
  }

  // Ring allgather: step s sends block v-s and receives block v-s-1.
  const int next = real(v + 1), prev = real(v - 1);
  std::vector<std::vector<StepIndex>> received(P - 1, std::vector<StepIndex>(C));
  for (int s = 0; s < P - 1; ++s) {
    const int sendBlock = modRank(v - s, P), recvBlock = modRank(v - s - 1, P);
    for (size_t c = 0; c < C; ++c)
      plan.send(next, blocks.chunk(BufferId::kRecv, sendBlock, c),
                s == 0 ? own : received[s - 1][c]);
    for (size_t c = 0; c < C; ++c)
      received[s][c] =
          plan.recv(prev, blocks.chunk(BufferId::kRecv, recvBlock, c), scatterSend[recvBlock]);
  }
  return plan;
}

namespace {

double chunksOf(double bytes, size_t chunkBytes) {
  return std::max(1.0, std::ceil(bytes / std::max<size_t>(chunkBytes, 1)));
}

}  // namespace

Cost estimateBroadcastChain(const CollectiveArgs& a, const LinkModel& m) {
  Cost c;
  const int P = a.nranks;
  if (P == 1) return c;
  const double bytes = static_cast<double>(a.bytes());
  const double chunks = chunksOf(bytes, a.chunkBytes);
  c.steps = P - 1;
  c.bytesSent = bytes;
  c.seconds = (P - 1 + chunks - 1) * (m.alpha + bytes / chunks * m.beta);
  return c;
}

// The root is the slowest rank: it sends (P-1)/P n in the scatter and again
// in the ring.
Cost estimateBroadcastScatterAllGather(const CollectiveArgs& a, const LinkModel& m) {
  Cost c;
  const int P = a.nranks;
  if (P == 1) return c;
  const double bytes = static_cast<double>(a.bytes());
  const double block = bytes / P;
  const double chunks = chunksOf(block, a.chunkBytes);
  const int lg = ceilLog2(P);
  c.steps = lg + P - 1;
  c.bytesSent = 2 * (P - 1) * block;
  c.seconds = lg * m.alpha + (P - 1) * block * m.beta +
              (P - 1) * chunks * (m.alpha + block / chunks * m.beta);
  return c;
}

}  // namespace braid::algo
