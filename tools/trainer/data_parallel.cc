#include "data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace trainer {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void check(braidResult_t result, const char* what) {
  if (result == braidSuccess) return;
  const char* detail = braidGetLastError(nullptr);
  throw BraidError(std::string(what) + " failed: " + braidGetErrorString(result) +
                   (detail[0] != '\0' ? std::string(": ") + detail : std::string()));
}

size_t wireBytes(Compression compression) {
  switch (compression) {
    case Compression::kFp32:
      return 4;
    case Compression::kBf16:
      return 2;
    default:
      return 8;
  }
}

std::vector<Bucket> makeBuckets(size_t values, size_t capValues) {
  std::vector<Bucket> buckets;
  if (capValues == 0) capValues = values;
  for (size_t end = values; end > 0;) {
    const size_t count = std::min(capValues, end);
    buckets.push_back(Bucket{end - count, count});
    end -= count;
  }
  return buckets;
}

uint16_t toBfloat16(double value) {
  // Through fp32, which is exact to bf16's purposes unless the fp64 value
  // lies within fp32's rounding of a bf16 tie: a bias of one part in 2^16.
  const float narrow = float(value);
  uint32_t bits;
  std::memcpy(&bits, &narrow, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float fromBfloat16(uint16_t value) {
  uint32_t bits = uint32_t(value) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

GradientExchange::GradientExchange(braidComm_t comm, SyncMode mode, Compression compression,
                                   bool overlap, std::vector<Bucket> buckets, size_t parameters)
    : comm_(comm),
      mode_(mode),
      compression_(compression),
      overlap_(overlap),
      buckets_(std::move(buckets)) {
  check(braidCommCount(comm_, &ranks_), "braidCommCount");
  check(braidStreamCreate(comm_, &stream_), "braidStreamCreate");
  if (compression_ == Compression::kFp32) narrow_.resize(parameters);
  if (compression_ == Compression::kBf16) staging_.resize(parameters);
}

GradientExchange::~GradientExchange() {
  braidStreamDestroy(stream_);
}

void GradientExchange::launch(double* grads, const Bucket& bucket) {
  const double* source = grads + bucket.offset;
  void* data = grads + bucket.offset;
  braidDataType_t type = braidFloat64;
  if (compression_ == Compression::kFp32) {
    float* wire = narrow_.data() + bucket.offset;
    for (size_t i = 0; i < bucket.count; ++i) wire[i] = float(source[i]);
    data = wire;
    type = braidFloat32;
  } else if (compression_ == Compression::kBf16) {
    uint16_t* wire = staging_.data() + bucket.offset;
    for (size_t i = 0; i < bucket.count; ++i) wire[i] = toBfloat16(source[i]);
    data = wire;
    type = braidBfloat16;
  }
  // A single rank's sum is its own gradient; handing it to the stream
  // thread would only add a thread switch per bucket.
  if (ranks_ == 1) return;
  // Without overlap the calls block, so all of their time shows as waiting.
  braidStream_t stream = overlap_ ? stream_ : nullptr;
  double start = overlap_ ? 0.0 : now();
  if (mode_ == SyncMode::kAllReduce) {
    check(braidAllReduce(data, data, bucket.count, type, braidSum, comm_, stream),
          "braidAllReduce (gradients)");
  } else {
    check(braidReduce(data, data, bucket.count, type, braidSum, 0, comm_, stream),
          "braidReduce (gradients)");
  }
  if (!overlap_) waitSeconds_ += now() - start;
}

void GradientExchange::ready(double* grads, size_t frontier) {
  if (!overlap_) return;
  while (launched_ < buckets_.size() && buckets_[launched_].offset >= frontier)
    launch(grads, buckets_[launched_++]);
}

void GradientExchange::reduceStats(double* values, int n) {
  if (ranks_ == 1) return;
  double start = now();
  check(braidAllReduce(values, values, size_t(n), braidFloat64, braidSum, comm_,
                       overlap_ ? stream_ : nullptr),
        "braidAllReduce (statistics)");
  if (!overlap_) waitSeconds_ += now() - start;
}

void GradientExchange::finish(double* grads) {
  while (launched_ < buckets_.size()) launch(grads, buckets_[launched_++]);
  launched_ = 0;
  if (overlap_ && ranks_ > 1) {
    double start = now();
    check(braidStreamSynchronize(stream_), "braidStreamSynchronize");
    waitSeconds_ += now() - start;
  }
  for (const Bucket& bucket : buckets_) {
    double* out = grads + bucket.offset;
    if (compression_ == Compression::kFp32) {
      const float* wire = narrow_.data() + bucket.offset;
      for (size_t i = 0; i < bucket.count; ++i) out[i] = wire[i];
    } else if (compression_ == Compression::kBf16) {
      const uint16_t* wire = staging_.data() + bucket.offset;
      for (size_t i = 0; i < bucket.count; ++i) out[i] = fromBfloat16(wire[i]);
    }
  }
}

void GradientExchange::broadcastParameters(float* params, size_t count) {
  if (ranks_ == 1) return;
  double start = now();
  check(braidBroadcast(params, params, count, braidFloat32, 0, comm_, nullptr),
        "braidBroadcast (parameters)");
  waitSeconds_ += now() - start;
}

double GradientExchange::takeWaitSeconds() {
  double seconds = waitSeconds_;
  waitSeconds_ = 0;
  return seconds;
}

}  // namespace trainer
