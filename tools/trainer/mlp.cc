#include "mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>

namespace trainer {
namespace {

int roundUp(int n, int multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace

Mlp::Mlp(std::vector<int> sizes, int maxBatch)
    : sizes_(std::move(sizes)),
      // Room for the lead rows of input(): a batch may start anywhere in a block.
      maxBatch_(roundUp(std::max(maxBatch, 1) + kBlockRows - 1, kBlockRows)) {
  if (sizes_.size() < 2)
    throw std::invalid_argument("an MLP needs at least an input and an output");
  size_t offset = 0;
  int widest = sizes_.front();
  for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
    LayerShape layer;
    layer.in = sizes_[l];
    layer.out = sizes_[l + 1];
    layer.weightOffset = offset;
    layer.biasOffset = offset + size_t(layer.in) * size_t(layer.out);
    layer.end = layer.biasOffset + size_t(layer.out);
    offset = layer.end;
    layers_.push_back(layer);
    widest = std::max(widest, layer.out);
    activations_.emplace_back(size_t(maxBatch_) * size_t(layer.out));
  }
  const size_t cells = size_t(maxBatch_) * size_t(widest);
  input_.resize(size_t(maxBatch_) * size_t(sizes_.front()));
  delta_.resize(cells);
  nextDelta_.resize(cells);
  wideInput_.resize(cells);
  wideDelta_.resize(cells);
}

void Mlp::initialize(float* params, uint64_t seed) const {
  std::mt19937_64 engine(seed);
  auto uniform = [&engine] { return (double(engine() >> 11) + 0.5) * 0x1.0p-53; };  // (0, 1)
  for (const LayerShape& layer : layers_) {
    const double stddev = std::sqrt(2.0 / layer.in);
    const size_t count = size_t(layer.in) * size_t(layer.out);
    for (size_t i = 0; i < count; i += 2) {
      // Box-Muller: two normal numbers per pair of uniforms.
      double radius = std::sqrt(-2.0 * std::log(uniform()));
      double angle = 2.0 * M_PI * uniform();
      params[layer.weightOffset + i] = float(stddev * radius * std::cos(angle));
      if (i + 1 < count)
        params[layer.weightOffset + i + 1] = float(stddev * radius * std::sin(angle));
    }
    std::fill(params + layer.biasOffset, params + layer.end, 0.0f);
  }
}

// OpenBLAS picks its kernel by the shape of the product, and its kernels
// round differently (a product of few rows takes another path than one of
// many); some kernels (Haswell's and Zen's sgemm) also round a row by where
// it sits in the product. Products over samples therefore always have
// exactly kBlockRows rows, padded with zero rows before the first sample
// and after the last so that each sample keeps its row of the global
// batch's blocks (input()): then a sample's activations do not depend on
// the share it came in, and N ranks with B/N samples each compute exactly
// what one rank with B samples does.
void Mlp::multiplyBlocks(bool transposeWeights, int rows, int k, int columns, const float* a,
                         const float* weights, float beta, float* c) const {
  for (int start = 0; start < rows; start += kBlockRows) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, transposeWeights ? CblasTrans : CblasNoTrans,
                kBlockRows, columns, k, 1.0f, a + size_t(start) * size_t(k), k, weights,
                transposeWeights ? k : columns, beta, c + size_t(start) * size_t(columns), columns);
  }
}

const float* Mlp::forward(const float* params, int n) {
  paddedRows_ = roundUp(leadRows_ + n, kBlockRows);
  const ptrdiff_t width = sizes_.front();
  std::fill(input_.begin(), input_.begin() + leadRows_ * width, 0.0f);
  std::fill(input_.begin() + (leadRows_ + n) * width, input_.begin() + paddedRows_ * width, 0.0f);
  const float* x = input_.data();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerShape& layer = layers_[l];
    float* y = activations_[l].data();
    const float* bias = params + layer.biasOffset;
    for (int i = 0; i < paddedRows_; ++i)
      std::memcpy(y + size_t(i) * size_t(layer.out), bias, sizeof(float) * size_t(layer.out));
    multiplyBlocks(false, paddedRows_, layer.in, layer.out, x, params + layer.weightOffset, 1.0f,
                   y);
    if (l + 1 < layers_.size()) {
      const size_t size = size_t(paddedRows_) * size_t(layer.out);
      for (size_t i = 0; i < size; ++i) y[i] = std::max(y[i], 0.0f);
    }
    x = y;
  }
  return activations_.back().data() + size_t(leadRows_) * size_t(layers_.back().out);
}

BatchStats Mlp::lossAndGradient(const uint8_t* labels, int n) {
  BatchStats stats;
  const int classes = layers_.back().out;
  const size_t lead = size_t(leadRows_) * size_t(classes);
  const float* logits = activations_.back().data() + lead;
  for (int i = 0; i < n; ++i) {
    const float* z = logits + size_t(i) * size_t(classes);
    float* g = delta_.data() + lead + size_t(i) * size_t(classes);
    int best = 0;
    for (int c = 1; c < classes; ++c)
      if (z[c] > z[best]) best = c;
    const float top = z[best];
    float sum = 0;
    for (int c = 0; c < classes; ++c) {
      g[c] = std::exp(z[c] - top);
      sum += g[c];
    }
    const float inverse = 1.0f / sum;
    for (int c = 0; c < classes; ++c) g[c] *= inverse;
    g[labels[i]] -= 1.0f;
    stats.lossSum += double(std::log(sum) - (z[labels[i]] - top));
    stats.correct += best == labels[i];
  }
  // Padding rows carry no gradient.
  std::fill(delta_.begin(), delta_.begin() + ptrdiff_t(lead), 0.0f);
  std::fill(delta_.begin() + ptrdiff_t(leadRows_ + n) * classes,
            delta_.begin() + ptrdiff_t(paddedRows_) * classes, 0.0f);
  return stats;
}

// The sums over samples of the weight gradient are taken in fp64. Each term
// is an exact product of fp32 numbers, so the sum hardly depends on how the
// samples are grouped: a batch split over N ranks, summed in parts and added
// up by the collective, rounds to the same fp32 gradient as the whole batch
// on one rank. Summed in fp32, the grouping changes the last bits, and Adam,
// which divides by the gradient's running magnitude, turns those bits of
// nearly cancelling sums into visible weight differences within 100 steps.
void Mlp::backward(const float* params, int n, double* grads, size_t pieceValues,
                   const std::function<void(size_t)>& ready) {
  float* delta = delta_.data();
  float* below = nextDelta_.data();
  for (int l = int(layers_.size()) - 1; l >= 0; --l) {
    const LayerShape& layer = layers_[size_t(l)];
    const float* x = l == 0 ? input_.data() : activations_[size_t(l) - 1].data();
    double* gradWeights = grads + layer.weightOffset;
    double* gradBias = grads + layer.biasOffset;
    const float* xFirst = x + size_t(leadRows_) * size_t(layer.in);
    const float* deltaFirst = delta + size_t(leadRows_) * size_t(layer.out);
    std::copy(xFirst, xFirst + size_t(n) * size_t(layer.in), wideInput_.begin());
    std::copy(deltaFirst, deltaFirst + size_t(n) * size_t(layer.out), wideDelta_.begin());
    std::fill(gradBias, gradBias + layer.out, 0.0);
    for (int i = 0; i < n; ++i) {
      const double* d = wideDelta_.data() + size_t(i) * size_t(layer.out);
      for (int o = 0; o < layer.out; ++o) gradBias[o] += d[o];
    }
    ready(layer.biasOffset);
    // Weight rows [first, last) belong to inputs first..last-1; the pieces
    // go from the last input down, so that the final part grows from the end.
    const int pieceRows =
        pieceValues == 0
            ? layer.in
            : int(std::clamp<size_t>(pieceValues / size_t(layer.out), 1, size_t(layer.in)));
    for (int last = layer.in; last > 0; last -= pieceRows) {
      const int first = std::max(0, last - pieceRows);
      double* rows = gradWeights + size_t(first) * size_t(layer.out);
      if (n > 0) {
        cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, last - first, layer.out, n, 1.0,
                    wideInput_.data() + first, layer.in, wideDelta_.data(), layer.out, 0.0, rows,
                    layer.out);
      } else {
        std::fill(rows, rows + size_t(last - first) * size_t(layer.out), 0.0);
      }
      ready(layer.weightOffset + size_t(first) * size_t(layer.out));
    }
    if (l == 0) break;
    multiplyBlocks(true, paddedRows_, layer.out, layer.in, delta, params + layer.weightOffset, 0.0f,
                   below);
    // ReLU's derivative, read off its output: zero where the unit was off.
    const size_t cells = size_t(paddedRows_) * size_t(layer.in);
    for (size_t i = 0; i < cells; ++i)
      if (x[i] <= 0.0f) below[i] = 0.0f;
    std::swap(delta, below);
  }
}

BatchStats Mlp::evaluate(const float* params, const uint8_t* labels, int n) {
  forward(params, n);
  return lossAndGradient(labels, n);
}

}  // namespace trainer
