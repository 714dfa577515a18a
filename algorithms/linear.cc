// Algorithms where every rank talks to its partners directly: linear Gather
// and Scatter through the root, pairwise AllToAll, and the dissemination
// Barrier. All their messages are posted at once; the progress engine and
// the transport keep them moving without deadlock.
#include "algorithms/algorithm.h"
#include "algorithms/patterns.h"

namespace braid::algo {

Schedule planGatherLinear(const CollectiveArgs& args) {
  Schedule plan;
  const size_t bytes = args.bytes();
  const Slice own{BufferId::kSend, 0, bytes};
  if (args.rank != args.root) {
    plan.send(args.root, own);
    return plan;
  }
  for (int p = 0; p < args.nranks; ++p) {
    Slice part{BufferId::kRecv, p * bytes, bytes};
    if (p != args.root)
      plan.recv(p, part);
    else if (!args.inPlace)
      plan.copy(part, own);
  }
  return plan;
}

Schedule planScatterLinear(const CollectiveArgs& args) {
  Schedule plan;
  const size_t bytes = args.bytes();
  const Slice own{BufferId::kRecv, 0, bytes};
  if (args.rank != args.root) {
    plan.recv(args.root, own);
    return plan;
  }
  for (int p = 0; p < args.nranks; ++p) {
    Slice part{BufferId::kSend, p * bytes, bytes};
    if (p != args.root)
      plan.send(p, part);
    else if (!args.inPlace)
      plan.copy(own, part);
  }
  return plan;
}

// Round i: send to rank+i, receive from rank-i, so every rank has exactly one
// partner in each direction per round and no link is hot.
Schedule planAllToAllPairwise(const CollectiveArgs& args) {
  Schedule plan;
  const size_t bytes = args.bytes();
  const int P = args.nranks, r = args.rank;
  plan.copy({BufferId::kRecv, r * bytes, bytes}, {BufferId::kSend, r * bytes, bytes});
  for (int i = 1; i < P; ++i) {
    const int to = modRank(r + i, P), from = modRank(r - i, P);
    plan.send(to, {BufferId::kSend, to * bytes, bytes});
    plan.recv(from, {BufferId::kRecv, from * bytes, bytes});
  }
  return plan;
}

// Round k: notify rank + 2^k, wait for rank - 2^k. After ceil(log2 P) rounds
// every rank has heard, transitively, from every other.
Schedule planBarrierDissemination(const CollectiveArgs& args) {
  Schedule plan;
  const int P = args.nranks, r = args.rank;
  StepIndex heard = kNoStep;
  for (int k = 1; k < P; k <<= 1) {
    plan.send(modRank(r + k, P), {}, heard);
    heard = plan.recv(modRank(r - k, P), {}, heard);
  }
  return plan;
}

}  // namespace braid::algo

namespace braid::algo {

// The root receives (or sends) P-1 messages one after another.
Cost estimateGatherLinear(const CollectiveArgs& a, const LinkModel& m) {
  Cost c;
  c.steps = a.nranks - 1;
  c.bytesSent = static_cast<double>(a.bytes()) * (a.nranks - 1);
  c.seconds = roundsTime(m, a.nranks - 1, static_cast<double>(a.bytes()));
  return c;
}

Cost estimateScatterLinear(const CollectiveArgs& a, const LinkModel& m) {
  return estimateGatherLinear(a, m);
}

Cost estimateAllToAllPairwise(const CollectiveArgs& a, const LinkModel& m) {
  return estimateGatherLinear(a, m);
}

Cost estimateBarrierDissemination(const CollectiveArgs& a, const LinkModel& m) {
  Cost c;
  for (int k = 1; k < a.nranks; k <<= 1) ++c.steps;
  c.seconds = roundsTime(m, c.steps, 0);
  return c;
}

}  // namespace braid::algo
