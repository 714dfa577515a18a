// A Schedule is what an algorithm produces: the sends, receives, reductions
// and copies one rank performs for one collective, over slices of abstract
// buffers, with the order constraints between them. It does no I/O and names
// no transport; the progress engine binds the buffers and moves the bytes.
//
// Matching rule (the contract between schedules of different ranks): the
// k-th Send to peer p in one rank's schedule is received by the k-th Recv
// (or RecvReduce) from this rank in p's schedule, with the same byte count.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace braid::algo {

enum class BufferId : uint8_t { kSend, kRecv, kScratch };

struct Slice {
  BufferId buffer = BufferId::kRecv;
  size_t offset = 0;  // bytes
  size_t bytes = 0;
};

enum class StepKind : uint8_t {
  kSend,     // src -> peer
  kRecv,     // peer -> dst
  kReduce,   // dst = src op src2 (element-wise, the collective's dtype and op)
  kCopy,     // dst = src
  kAverage,  // dst /= nranks (final step of RedOp::kAvg)
  // dst = src op (dst.bytes arriving from peer), or (incoming) op src with
  // incomingFirst: a Recv and the Reduce that consumes it, fused so the
  // incoming bytes need no buffer (fuse.h).
  kRecvReduce,
};

using StepIndex = int32_t;
inline constexpr StepIndex kNoStep = -1;

struct Step {
  StepKind kind = StepKind::kCopy;
  int peer = -1;
  Slice dst;
  Slice src;
  Slice src2;
  // Steps that must be complete before this one starts (kNoStep = unused).
  std::array<StepIndex, 2> after = {kNoStep, kNoStep};
  // kRecvReduce: the incoming bytes are the left operand. The ops are
  // commutative, but not to the bit: where ranks each compute the same
  // result they must agree on every bit (max of +0 and -0, which NaN a sum
  // keeps), so both combine the pair in one order.
  bool incomingFirst = false;
};

inline bool receives(StepKind kind) {
  return kind == StepKind::kRecv || kind == StepKind::kRecvReduce;
}

struct Schedule {
  std::vector<Step> steps;
  size_t scratchBytes = 0;

  StepIndex add(const Step& step) {
    steps.push_back(step);
    return static_cast<StepIndex>(steps.size() - 1);
  }
  StepIndex send(int peer, Slice src, StepIndex a = kNoStep, StepIndex b = kNoStep) {
    return add({StepKind::kSend, peer, {}, src, {}, {a, b}});
  }
  StepIndex recv(int peer, Slice dst, StepIndex a = kNoStep, StepIndex b = kNoStep) {
    return add({StepKind::kRecv, peer, dst, {}, {}, {a, b}});
  }
  StepIndex reduce(Slice dst, Slice src, Slice src2, StepIndex a = kNoStep, StepIndex b = kNoStep) {
    return add({StepKind::kReduce, -1, dst, src, src2, {a, b}});
  }
  StepIndex copy(Slice dst, Slice src, StepIndex a = kNoStep, StepIndex b = kNoStep) {
    return add({StepKind::kCopy, -1, dst, src, {}, {a, b}});
  }
  StepIndex recvReduce(int peer, Slice dst, Slice src, StepIndex a = kNoStep,
                       StepIndex b = kNoStep) {
    return add({StepKind::kRecvReduce, peer, dst, src, {}, {a, b}});
  }
  // dst = (incoming) op src.
  StepIndex recvReduceIncomingFirst(int peer, Slice dst, Slice src, StepIndex a = kNoStep,
                                    StepIndex b = kNoStep) {
    return add({StepKind::kRecvReduce, peer, dst, src, {}, {a, b}, true});
  }
  StepIndex average(Slice dst, StepIndex a = kNoStep, StepIndex b = kNoStep) {
    return add({StepKind::kAverage, -1, dst, {}, {}, {a, b}});
  }
};

// Checks that the schedule is well formed: dependencies point backwards,
// slices of Send/Recv/Scratch lie inside buffers of the given sizes, and
// element-wise steps cover whole elements. Returns "" or the first problem.
std::string validate(const Schedule& schedule, size_t sendBytes, size_t recvBytes,
                     size_t elementSize);

}  // namespace braid::algo
