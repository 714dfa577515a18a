#include "algorithms/fuse.h"

#include <algorithm>
#include <vector>

namespace braid::algo {

namespace {

bool sameSlice(const Slice& a, const Slice& b) {
  return a.buffer == b.buffer && a.offset == b.offset && a.bytes == b.bytes;
}

bool dependsOn(const Step& step, StepIndex d) {
  return step.after[0] == d || step.after[1] == d;
}

struct Candidate {
  StepIndex recv;
  StepIndex reduce;
  bool incomingIsSrc2;  // else the Reduce's src is the incoming slice
};

}  // namespace

size_t fuseReceiveReductions(Schedule& schedule) {
  std::vector<Step>& steps = schedule.steps;
  const auto n = static_cast<StepIndex>(steps.size());
  // The single dependent of each step, -2 when it has several.
  std::vector<StepIndex> onlyDependent(n, kNoStep);
  for (StepIndex i = 0; i < n; ++i)
    for (StepIndex d : steps[i].after)
      if (d != kNoStep) onlyDependent[d] = onlyDependent[d] == kNoStep ? i : -2;

  std::vector<Candidate> candidates;
  std::vector<bool> incomingOperand(n, false);  // the Reduce reads its Recv's slice there
  for (StepIndex r = 0; r < n; ++r) {
    const Step& recv = steps[r];
    if (recv.kind != StepKind::kRecv || recv.dst.buffer != BufferId::kScratch || !recv.dst.bytes)
      continue;
    const StepIndex d = onlyDependent[r];
    if (d < 0 || steps[d].kind != StepKind::kReduce) continue;
    const Step& reduce = steps[d];
    const bool inSrc2 = sameSlice(reduce.src2, recv.dst);
    if (!inSrc2 && !sameSlice(reduce.src, recv.dst)) continue;
    const StepIndex other = reduce.after[0] == r ? reduce.after[1] : reduce.after[0];
    if (other != kNoStep && !dependsOn(recv, other)) continue;
    candidates.push_back({r, d, inSrc2});
    incomingOperand[d] = true;
  }
  if (candidates.empty()) return 0;

  // Every read of scratch that is not a candidate Reduce reading its own
  // Recv's slice, as sorted intervals.
  struct Interval {
    size_t begin, end;
  };
  std::vector<Interval> foreign;
  auto addRead = [&](const Slice& s) {
    if (s.buffer == BufferId::kScratch && s.bytes)
      foreign.push_back({s.offset, s.offset + s.bytes});
  };
  for (StepIndex i = 0; i < n; ++i) {
    const Step& s = steps[i];
    switch (s.kind) {
      case StepKind::kSend:
      case StepKind::kCopy:
      case StepKind::kRecvReduce:
        addRead(s.src);
        break;
      case StepKind::kReduce:
        if (!incomingOperand[i]) {
          addRead(s.src);
          addRead(s.src2);
        }
        break;
      case StepKind::kAverage:  // reads what it writes
        addRead(s.dst);
        break;
      case StepKind::kRecv:
        break;
    }
  }
  for (const Candidate& c : candidates) {
    // The candidate Reduce's other operand is a read like any other.
    const Step& reduce = steps[c.reduce];
    addRead(c.incomingIsSrc2 ? reduce.src : reduce.src2);
  }
  std::sort(foreign.begin(), foreign.end(),
            [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  // Prefix maximum of the ends, for an O(log n) overlap query.
  std::vector<size_t> maxEnd(foreign.size());
  for (size_t i = 0; i < foreign.size(); ++i)
    maxEnd[i] = std::max(foreign[i].end, i ? maxEnd[i - 1] : 0);
  auto overlapsForeign = [&](const Slice& s) {
    // Intervals starting before s ends; any of them ending after s begins?
    auto it = std::lower_bound(foreign.begin(), foreign.end(), s.offset + s.bytes,
                               [](const Interval& a, size_t v) { return a.begin < v; });
    const size_t count = static_cast<size_t>(it - foreign.begin());
    return count > 0 && maxEnd[count - 1] > s.offset;
  };

  size_t fused = 0;
  for (const Candidate& c : candidates) {
    Step& recv = steps[c.recv];
    Step& reduce = steps[c.reduce];
    if (overlapsForeign(recv.dst)) continue;
    const Slice local = c.incomingIsSrc2 ? reduce.src : reduce.src2;
    recv.kind = StepKind::kRecvReduce;
    recv.src = local;
    recv.dst = reduce.dst;
    // The Reduce's order of operands, kept: incoming op local where the
    // incoming bytes were its left one.
    recv.incomingFirst = !c.incomingIsSrc2;
    // The Reduce stays as an empty Copy, so that its dependents still wait
    // for the (now fused) receive.
    reduce.kind = StepKind::kCopy;
    reduce.dst = reduce.src = reduce.src2 = Slice{BufferId::kRecv, 0, 0};
    ++fused;
  }
  return fused;
}

}  // namespace braid::algo
