#include "algorithms/split.h"

#include <algorithm>
#include <vector>

namespace braid::algo {
namespace {

bool isTransfer(StepKind kind) {
  return kind == StepKind::kSend || kind == StepKind::kRecv || kind == StepKind::kRecvReduce;
}

size_t transferBytes(const Step& step) {
  return step.kind == StepKind::kSend ? step.src.bytes : step.dst.bytes;
}

// The part [offset, offset + bytes) of a transfer's payload.
Step pieceOf(const Step& step, size_t offset, size_t bytes) {
  Step piece = step;
  auto narrow = [&](Slice& s) {
    s.offset += offset;
    s.bytes = bytes;
  };
  if (step.kind == StepKind::kSend) {
    narrow(piece.src);
  } else {
    narrow(piece.dst);
    if (step.kind == StepKind::kRecvReduce) narrow(piece.src);  // the local operand
  }
  return piece;
}

}  // namespace

size_t wholePieceBytes(size_t pieceBytes, size_t elementSize) {
  elementSize = std::max<size_t>(elementSize, 1);
  return std::max(elementSize, pieceBytes / elementSize * elementSize);
}

Schedule splitTransfers(const Schedule& schedule, size_t pieceBytes, size_t elementSize) {
  const size_t piece = wholePieceBytes(pieceBytes, elementSize);
  Schedule out;
  out.scratchBytes = schedule.scratchBytes;
  out.steps.reserve(schedule.steps.size());
  // Where each step of `schedule` ends up: itself, or the join of its pieces.
  std::vector<StepIndex> moved(schedule.steps.size(), kNoStep);
  for (size_t i = 0; i < schedule.steps.size(); ++i) {
    Step step = schedule.steps[i];
    for (StepIndex& a : step.after)
      if (a != kNoStep) a = moved[static_cast<size_t>(a)];
    const size_t bytes = transferBytes(step);
    if (!isTransfer(step.kind) || bytes <= piece) {
      moved[i] = out.add(step);
      continue;
    }
    StepIndex joined = kNoStep;
    for (size_t offset = 0; offset < bytes; offset += piece) {
      const StepIndex p = out.add(pieceOf(step, offset, std::min(piece, bytes - offset)));
      joined = joined == kNoStep ? p : out.copy(Slice{}, Slice{}, joined, p);
    }
    moved[i] = joined;
  }
  return out;
}

}  // namespace braid::algo
