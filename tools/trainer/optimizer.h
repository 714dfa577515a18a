// SGD with momentum and Adam, as PyTorch defines them (torch.optim.SGD with
// dampening 0, torch.optim.Adam), over the flat parameter array.
#ifndef BRAID_TOOLS_TRAINER_OPTIMIZER_H_
#define BRAID_TOOLS_TRAINER_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainer {

enum class OptimizerKind : uint32_t { kSgd = 0, kAdam = 1 };

const char* optimizerName(OptimizerKind kind);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdam;
  float learningRate = 1e-3f;
  float momentum = 0.9f;  // SGD
  float beta1 = 0.9f;     // Adam
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float weightDecay = 0.0f;  // L2 penalty added to the gradient, as torch.optim does
};

class Optimizer {
 public:
  Optimizer(const OptimizerConfig& config, size_t parameters);

  // params -= update(gradSums / divisor), the gradient rounded to fp32
  // once. The trainer hands in gradients summed over the global batch and
  // the batch size as the divisor.
  void step(float* __restrict params, const double* __restrict gradSums, double divisor);

  // For a learning-rate schedule: the rate of the following steps.
  void setLearningRate(float rate) { config_.learningRate = rate; }

  // The state a resumed run needs: step count and moment buffers (the
  // momentum buffer for SGD, first and second moments for Adam).
  int64_t steps() const { return steps_; }
  void setSteps(int64_t steps) { steps_ = steps; }
  std::vector<float>& first() { return first_; }
  std::vector<float>& second() { return second_; }
  const std::vector<float>& first() const { return first_; }
  const std::vector<float>& second() const { return second_; }

 private:
  OptimizerConfig config_;
  int64_t steps_ = 0;
  std::vector<float> first_;
  std::vector<float> second_;
};

}  // namespace trainer

#endif  // BRAID_TOOLS_TRAINER_OPTIMIZER_H_
