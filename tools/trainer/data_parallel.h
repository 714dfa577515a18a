// Gradient exchange between data-parallel ranks, through braid.h only.
//
// The flat gradient array is cut into buckets of about --bucket-kb, counted
// from its end, since the backward pass finishes the last layer first.
// backward() reports how far down the array its gradients are final; a
// bucket's collective is queued on a braid host stream as soon as the whole
// bucket is, so it runs while the compute thread works on the rest of the
// backward pass. finish() waits for them all before the optimizer step.
#ifndef BRAID_TOOLS_TRAINER_DATA_PARALLEL_H_
#define BRAID_TOOLS_TRAINER_DATA_PARALLEL_H_

#include <braid.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "host_buffer.h"

namespace trainer {

// A braid call that failed; the message is braid's.
class BraidError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws BraidError naming `what` when `result` is not braidSuccess.
void check(braidResult_t result, const char* what);

// allreduce: every rank sums the gradients (AllReduce) and steps its own
// optimizer. ps: the parameter-server pattern, Reduce to rank 0, which alone
// steps the optimizer, then Broadcast of the new weights.
enum class SyncMode { kAllReduce, kParameterServer };

// The type gradients travel in. The trainer sums gradients in fp64 (see
// Mlp::backward), and by default they travel so, which keeps N ranks
// equivalent to one; fp32 and bf16 halve and quarter the bytes.
enum class Compression { kNone, kFp32, kBf16 };

size_t wireBytes(Compression compression);

struct Bucket {
  size_t offset = 0;  // range in the flat gradient array
  size_t count = 0;
};

// Buckets of capValues from the end of an array of `values` to its start,
// the last one (at the start) holding what remains; capValues 0 gives a
// single bucket.
std::vector<Bucket> makeBuckets(size_t values, size_t capValues);

// Round to nearest even, as hardware bf16 conversion does; NaN stays NaN.
uint16_t toBfloat16(double value);
float fromBfloat16(uint16_t value);

class GradientExchange {
 public:
  GradientExchange(braidComm_t comm, SyncMode mode, Compression compression, bool overlap,
                   std::vector<Bucket> buckets, size_t parameters);
  ~GradientExchange();
  GradientExchange(const GradientExchange&) = delete;
  GradientExchange& operator=(const GradientExchange&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }

  // From backward(): grads[frontier..end) are final for this step. Queues
  // the collectives of the buckets that lie wholly there.
  void ready(double* grads, size_t frontier);

  // Queues an fp64 sum over ranks of values[0..n) after this step's
  // gradients; the result is there after finish().
  void reduceStats(double* values, int n);

  // Waits for the step's collectives. Then `grads` holds the gradients
  // summed over all ranks (rounded to the wire type): on every rank for
  // allreduce, on rank 0 for ps.
  void finish(double* grads);

  // ps: rank 0's updated parameters to every rank.
  void broadcastParameters(float* params, size_t count);

  // Seconds the calling thread spent waiting for communication since the
  // last call (the part of communication that computing did not hide).
  double takeWaitSeconds();

 private:
  void launch(double* grads, const Bucket& bucket);

  braidComm_t comm_;
  int ranks_ = 1;
  braidStream_t stream_ = nullptr;
  SyncMode mode_;
  Compression compression_;
  bool overlap_;
  std::vector<Bucket> buckets_;   // in launch order: from the end of the array
  size_t launched_ = 0;           // buckets queued this step
  HostBuffer<float> narrow_;      // fp32 gradients on the wire
  HostBuffer<uint16_t> staging_;  // bf16 gradients on the wire
  double waitSeconds_ = 0;
};

}  // namespace trainer

#endif  // BRAID_TOOLS_TRAINER_DATA_PARALLEL_H_
