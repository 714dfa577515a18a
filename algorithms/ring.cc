// Ring algorithms: AllReduce (reduce-scatter then allgather), ReduceScatter
// and AllGather. Every rank sends only to next = rank+1 and receives only
// from prev = rank-1, so each link carries (P-1)/P of the data per phase:
// bandwidth-optimal, with P-1 latency terms per phase.
//
//   reduce-scatter, step s: send block (r-s), receive block (r-s-1) and
//   reduce it with the local contribution. After P-1 steps rank r holds
//   the fully reduced block (r+1).
//
//      rank0 --b0--> rank1 --b1--> rank2 --b2--> rank0      (s = 0, P = 3)
//      rank0 --b2--> rank1 --b0--> rank2 --b1--> rank0      (s = 1)
//
//   allgather, step s: send block (r+1-s), receive block (r-s).
//
// Each block is cut into chunks of at most chunkBytes; the send of chunk c at
// step s+1 waits only for the reduction of chunk c at step s, so sending,
// receiving and reducing overlap along the ring (pipelining). Incoming
// chunks land in two alternating scratch slots.
#include <algorithm>
#include <cmath>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/blocks.h"
#include "algorithms/patterns.h"

namespace braid::algo {
namespace {

// Cuts a vector of `count` elements into P blocks and each block into the
// same number of chunks, so chunk c of every block exists (possibly empty)
// and matching ranks agree on every message size.
class BlockChunks {
 public:
  BlockChunks(size_t count, int nranks, size_t elementSize, size_t chunkBytes, bool equalBlocks)
      : count_(count), nranks_(nranks), es_(elementSize), equal_(equalBlocks) {
    maxBlock_ = equal_ ? count : evenPart(count, nranks, 0).size;
    chunks_ = chunkCount(maxBlock_, std::max<size_t>(1, chunkBytes / es_));
  }
  size_t chunks() const { return chunks_; }
  size_t maxBlockBytes() const { return maxBlock_ * es_; }

  // Chunk c of block b of a buffer laid out as P blocks.
  Slice chunk(BufferId buffer, int block, size_t c) const {
    Range b = equal_ ? Range{static_cast<size_t>(block) * count_, count_}
                     : evenPart(count_, nranks_, block);
    Range ch = evenPart(b.size, chunks_, c);
    return {buffer, (b.begin + ch.begin) * es_, ch.size * es_};
  }
  // Chunk c of a buffer holding one block (ReduceScatter output, AllGather input).
  Slice single(BufferId buffer, size_t c, size_t baseOffset = 0) const {
    Range ch = evenPart(count_, chunks_, c);
    return {buffer, baseOffset + ch.begin * es_, ch.size * es_};
  }
  // Region c of scratch slot `slot`, sized for `bytes`.
  Slice slot(int slot, size_t c, size_t bytes) const {
    return {BufferId::kScratch,
            slot * maxBlockBytes() + evenPart(maxBlock_, chunks_, c).begin * es_, bytes};
  }

 private:
  size_t count_;
  int nranks_;
  size_t es_;
  bool equal_;
  size_t maxBlock_ = 0;
  size_t chunks_ = 1;
};

}  // namespace

Schedule planAllReduceRing(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, r = args.rank;
  if (P == 1) return planOwnInput(args);
  const int next = modRank(r + 1, P), prev = modRank(r - 1, P);
  BlockChunks blocks(args.count, P, args.elementSize(), args.chunkBytes, false);
  const size_t C = blocks.chunks();
  plan.scratchBytes = 2 * blocks.maxBlockBytes();

  StepGrid reduced(P - 1, std::vector<StepIndex>(C)), sent(P - 1, std::vector<StepIndex>(C));
  for (int s = 0; s < P - 1; ++s) {
    const int sendBlock = modRank(r - s, P), recvBlock = modRank(r - s - 1, P);
    for (size_t c = 0; c < C; ++c) {
      Slice src = blocks.chunk(s == 0 ? BufferId::kSend : BufferId::kRecv, sendBlock, c);
      sent[s][c] = plan.send(next, src, at(reduced, s - 1, c));
    }
    for (size_t c = 0; c < C; ++c) {
      Slice dst = blocks.chunk(BufferId::kRecv, recvBlock, c);
      Slice incoming = blocks.slot(s % 2, c, dst.bytes);
      StepIndex got = plan.recv(prev, incoming, at(reduced, s - 2, c));
      reduced[s][c] = plan.reduce(dst, incoming, blocks.chunk(BufferId::kSend, recvBlock, c), got);
    }
  }
  std::vector<StepIndex> final(C);
  for (size_t c = 0; c < C; ++c) {
    final[c] = reduced[P - 2][c];
    if (args.op == RedOp::kAvg)
      final[c] = plan.average(blocks.chunk(BufferId::kRecv, modRank(r + 1, P), c), final[c]);
  }
  StepGrid gathered(P - 1, std::vector<StepIndex>(C));
  for (int s = 0; s < P - 1; ++s) {
    const int sendBlock = modRank(r + 1 - s, P), recvBlock = modRank(r - s, P);
    for (size_t c = 0; c < C; ++c)
      plan.send(next, blocks.chunk(BufferId::kRecv, sendBlock, c),
                s == 0 ? final[c] : gathered[s - 1][c]);
    // The block arriving now was sent during reduce-scatter step s; it may be
    // overwritten only once that send is done.
    for (size_t c = 0; c < C; ++c)
      gathered[s][c] = plan.recv(prev, blocks.chunk(BufferId::kRecv, recvBlock, c), sent[s][c]);
  }
  return plan;
}

Schedule planReduceScatterRing(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, r = args.rank;
  BlockChunks blocks(args.count, P, args.elementSize(), args.chunkBytes, true);
  const size_t C = blocks.chunks();
  if (P == 1) {
    if (!args.inPlace)
      plan.copy({BufferId::kRecv, 0, args.bytes()}, {BufferId::kSend, 0, args.bytes()});
    return plan;
  }
  const int next = modRank(r + 1, P), prev = modRank(r - 1, P);
  // Slots 0-1: incoming chunks; slots 2-3: partial sums on their way on.
  plan.scratchBytes = 4 * blocks.maxBlockBytes();
  StepGrid reduced(P - 1, std::vector<StepIndex>(C)), sent(P - 1, std::vector<StepIndex>(C));
  for (int s = 0; s < P - 1; ++s) {
    const int sendBlock = modRank(r - s - 1, P), recvBlock = modRank(r - s - 2, P);
    const bool last = s == P - 2;
    for (size_t c = 0; c < C; ++c) {
      Slice size = blocks.chunk(BufferId::kSend, sendBlock, c);
      Slice src = s == 0 ? size : blocks.slot(2 + (s - 1) % 2, c, size.bytes);
      sent[s][c] = plan.send(next, src, at(reduced, s - 1, c));
    }
    for (size_t c = 0; c < C; ++c) {
      Slice mine = blocks.chunk(BufferId::kSend, recvBlock, c);
      Slice incoming = blocks.slot(s % 2, c, mine.bytes);
      StepIndex got = plan.recv(prev, incoming, at(reduced, s - 2, c));
      Slice dst = last ? blocks.single(BufferId::kRecv, c) : blocks.slot(2 + s % 2, c, mine.bytes);
      // The partial-sum slot is free once the send that read it is done.
      reduced[s][c] = plan.reduce(dst, incoming, mine, got, at(sent, s - 1, c));
    }
  }
  if (args.op == RedOp::kAvg)
    for (size_t c = 0; c < C; ++c)
      plan.average(blocks.single(BufferId::kRecv, c), reduced[P - 2][c]);
  return plan;
}

Schedule planAllGatherRing(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, r = args.rank;
  BlockChunks blocks(args.count, P, args.elementSize(), args.chunkBytes, true);
  const size_t C = blocks.chunks();
  if (!args.inPlace)
    for (size_t c = 0; c < C; ++c)
      plan.copy(blocks.chunk(BufferId::kRecv, r, c), blocks.single(BufferId::kSend, c));
  if (P == 1) return plan;
  const int next = modRank(r + 1, P), prev = modRank(r - 1, P);
  StepGrid received(P - 1, std::vector<StepIndex>(C));
  for (int s = 0; s < P - 1; ++s) {
    const int sendBlock = modRank(r - s, P), recvBlock = modRank(r - s - 1, P);
    for (size_t c = 0; c < C; ++c) {
      Slice src = s == 0 ? (args.inPlace ? blocks.chunk(BufferId::kRecv, r, c)
                                         : blocks.single(BufferId::kSend, c))
                         : blocks.chunk(BufferId::kRecv, sendBlock, c);
      plan.send(next, src, at(received, s - 1, c));
    }
    for (size_t c = 0; c < C; ++c)
      received[s][c] = plan.recv(prev, blocks.chunk(BufferId::kRecv, recvBlock, c));
  }
  return plan;
}

namespace {

// Every link carries P-1 blocks per phase, chunk after chunk, so the wire
// time is the whole of it: rounds * block * beta, plus alpha per chunk
// message. One engine thread sends and reduces, so reduction adds to it
// rather than hiding behind it: (P-1) * block * gamma for the reducing
// phase. Pipelining buys the overlap of latency, not fewer bytes.
Cost ringPhases(const CollectiveArgs& a, const LinkModel& m, int phases, bool reduces) {
  const int P = a.nranks;
  Cost c;
  if (P == 1) return c;
  const double block = static_cast<double>(a.bytes()) / P;
  const double chunks = std::max(1.0, std::ceil(block / std::max<size_t>(a.chunkBytes, 1)));
  const double rounds = phases * (P - 1);
  c.steps = static_cast<int>(rounds);
  c.bytesSent = rounds * block;
  // Every rank is busy in every round.
  c.seconds = (rounds * chunks * m.alpha + rounds * block * m.beta +
               (reduces ? (P - 1) * block * m.gamma : 0.0)) *
              m.stretch(P, P);
  return c;
}

}  // namespace

Cost estimateAllReduceRing(const CollectiveArgs& a, const LinkModel& m) {
  return ringPhases(a, m, 2, true);
}

Cost estimateReduceScatterRing(const CollectiveArgs& a, const LinkModel& m) {
  CollectiveArgs whole = a;
  whole.count = a.count * a.nranks;
  return ringPhases(whole, m, 1, true);
}

Cost estimateAllGatherRing(const CollectiveArgs& a, const LinkModel& m) {
  CollectiveArgs whole = a;
  whole.count = a.count * a.nranks;
  return ringPhases(whole, m, 1, false);
}

}  // namespace braid::algo
