#include "algorithms/schedule.h"

#include "src/common/strcat.h"

namespace braid::algo {

std::string validate(const Schedule& schedule, size_t sendBytes, size_t recvBytes,
                     size_t elementSize) {
  auto inside = [&](const Slice& s) {
    size_t limit = s.buffer == BufferId::kSend   ? sendBytes
                   : s.buffer == BufferId::kRecv ? recvBytes
                                                 : schedule.scratchBytes;
    return s.offset <= limit && s.bytes <= limit - s.offset;
  };
  for (size_t i = 0; i < schedule.steps.size(); ++i) {
    const Step& step = schedule.steps[i];
    for (StepIndex d : step.after)
      if (d != kNoStep && (d < 0 || static_cast<size_t>(d) >= i))
        return strCat("step ", i, " depends on step ", d, " which is not before it");
    bool usesDst = step.kind != StepKind::kSend;
    bool usesSrc = step.kind == StepKind::kSend || step.kind == StepKind::kReduce ||
                   step.kind == StepKind::kCopy || step.kind == StepKind::kRecvReduce;
    if (usesDst && !inside(step.dst)) return strCat("step ", i, " writes outside its buffer");
    if (usesSrc && !inside(step.src)) return strCat("step ", i, " reads outside its buffer");
    if (step.kind == StepKind::kReduce && (!inside(step.src2) || step.src.bytes != step.dst.bytes ||
                                           step.src2.bytes != step.dst.bytes))
      return strCat("step ", i, " reduces slices of different sizes");
    if ((step.kind == StepKind::kCopy || step.kind == StepKind::kRecvReduce) &&
        step.src.bytes != step.dst.bytes)
      return strCat("step ", i, " combines slices of different sizes");
    if (elementSize > 0 && (step.dst.bytes % elementSize || step.dst.offset % elementSize))
      return strCat("step ", i, " cuts an element");
  }
  return "";
}

}  // namespace braid::algo
