#include "optimizer.h"

#include <cmath>

namespace trainer {

const char* optimizerName(OptimizerKind kind) {
  return kind == OptimizerKind::kSgd ? "sgd" : "adam";
}

Optimizer::Optimizer(const OptimizerConfig& config, size_t parameters)
    : config_(config),
      first_(parameters, 0.0f),
      second_(config.kind == OptimizerKind::kAdam ? parameters : 0, 0.0f) {}

// The loops are written to vectorize (with -fno-math-errno for sqrt): this
// step touches every parameter and would otherwise cost as much as the
// matrix products of a small batch.
void Optimizer::step(float* __restrict params, const double* __restrict gradSums, double divisor) {
  ++steps_;
  const double scale = 1.0 / divisor;
  const size_t n = first_.size();
  const float lr = config_.learningRate;
  const float decay = config_.weightDecay;
  float* __restrict m = first_.data();
  if (config_.kind == OptimizerKind::kSgd) {
    const float mu = config_.momentum;
    // torch.optim.SGD starts the buffer at the first gradient; mu * 0 + g is the same.
    for (size_t i = 0; i < n; ++i) {
      const float g = float(gradSums[i] * scale) + decay * params[i];
      m[i] = mu * m[i] + g;
      params[i] -= lr * m[i];
    }
    return;
  }
  float* __restrict v = second_.data();
  const float b1 = config_.beta1;
  const float b2 = config_.beta2;
  const double t = double(steps_);
  const float stepSize = float(double(lr) / (1.0 - std::pow(double(b1), t)));
  const float secondCorrection = float(1.0 / std::sqrt(1.0 - std::pow(double(b2), t)));
  const float eps = config_.epsilon;
  for (size_t i = 0; i < n; ++i) {
    const float g = float(gradSums[i] * scale) + decay * params[i];
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    params[i] -= stepSize * m[i] / (std::sqrt(v[i]) * secondCorrection + eps);
  }
}

}  // namespace trainer
