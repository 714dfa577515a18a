// A multi-layer perceptron with ReLU hidden layers and a softmax
// cross-entropy loss, its matrix products done by CBLAS.
//
// All parameters live in one flat array, layer after layer, each layer its
// weights (in x out, row-major) then its biases (out). Gradients use the same
// layout, so a run of consecutive layers is one contiguous range: a gradient
// bucket is a single buffer for a collective, and the optimizer runs over
// the whole array at once.
#ifndef BRAID_TOOLS_TRAINER_MLP_H_
#define BRAID_TOOLS_TRAINER_MLP_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace trainer {

struct LayerShape {
  int in = 0;
  int out = 0;
  size_t weightOffset = 0;  // in the flat parameter array
  size_t biasOffset = 0;
  size_t end = 0;  // one past the layer's last parameter
};

struct BatchStats {
  double lossSum = 0;  // sum over samples of the cross-entropy
  int64_t correct = 0;
};

class Mlp {
 public:
  // sizes: input width, hidden widths..., number of classes.
  Mlp(std::vector<int> sizes, int maxBatch);

  const std::vector<int>& sizes() const { return sizes_; }
  const std::vector<LayerShape>& layers() const { return layers_; }
  size_t parameterCount() const { return layers_.back().end; }

  // He-normal weights, zero biases; the same stream of numbers for a seed
  // everywhere, as the generator and the normal transform are spelled out.
  void initialize(float* params, uint64_t seed) const;

  // Where the caller puts the batch: up to maxBatch rows of sizes()[0].
  // firstSample is the position of the batch's first row in the global
  // batch (a rank's share starts inside it): every sample then sits at the
  // same row of its block of kBlockRows on any number of ranks, which the
  // next forward() and backward() keep.
  float* input(int64_t firstSample = 0) {
    leadRows_ = int(firstSample % kBlockRows);
    return input_.data() + size_t(leadRows_) * size_t(sizes_.front());
  }

  // Runs the n rows of input() forward, keeping the activations for
  // backward(); returns the logits, n x classes.
  const float* forward(const float* params, int n);

  // Loss of the last forward() against `labels`, and the gradient of the
  // loss *summed* over the batch with respect to the logits.
  BatchStats lossAndGradient(const uint8_t* labels, int n);

  // Writes into `grads` the gradient of the summed loss of the last
  // forward()/lossAndGradient(), from the end of the array to its start:
  // each layer's biases, then its weights in pieces of about pieceValues
  // (0: whole layers). After each piece it calls ready(f): grads[f..end)
  // are final, so their exchange can start while the rest is computed.
  void backward(const float* params, int n, double* grads, size_t pieceValues,
                const std::function<void(size_t)>& ready);

  // Loss and correct predictions of the n rows of input(), by forward passes only.
  BatchStats evaluate(const float* params, const uint8_t* labels, int n);

  // Rows of every matrix product over samples; see multiplyBlocks() in mlp.cc.
  static constexpr int kBlockRows = 32;

 private:
  void multiplyBlocks(bool transposeWeights, int rows, int k, int columns, const float* a,
                      const float* weights, float beta, float* c) const;

  std::vector<int> sizes_;
  std::vector<LayerShape> layers_;
  int maxBatch_;
  int leadRows_ = 0;    // zero rows before the batch's first sample; see input()
  int paddedRows_ = 0;  // rows of the last forward(): leadRows_ + n rounded up to kBlockRows
  std::vector<float> input_;
  // activations_[l]: output of layer l after ReLU (logits for the last).
  std::vector<std::vector<float>> activations_;
  std::vector<float> delta_;       // gradient w.r.t. the current layer's pre-activation
  std::vector<float> nextDelta_;   // the same for the layer below
  std::vector<double> wideInput_;  // a layer's input in fp64, for the weight gradient
  std::vector<double> wideDelta_;
};

}  // namespace trainer

#endif  // BRAID_TOOLS_TRAINER_MLP_H_
