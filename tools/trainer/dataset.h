// Fashion-MNIST in IDX format (gzip-compressed or plain), held in memory as
// bytes: 60000 training images take 47 MB per rank, a quarter of their size
// as floats; batches are converted to floats as they are drawn.
#ifndef BRAID_TOOLS_TRAINER_DATASET_H_
#define BRAID_TOOLS_TRAINER_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer {

// A data file that is missing, unreadable, truncated or malformed. The
// message names the file and says how to fix it.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LabeledImages {
  size_t count = 0;
  size_t rows = 0;
  size_t cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, row-major, one image after another
  std::vector<uint8_t> labels;  // count, each in [0, kClasses)

  size_t features() const { return rows * cols; }
};

struct FashionMnist {
  LabeledImages train;
  LabeledImages test;
};

inline constexpr int kClasses = 10;
inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// Reads at most `limit` images (0: all) of an IDX image file and its label
// file. Throws DataError.
LabeledImages loadIdx(const std::string& imagesPath, const std::string& labelsPath, size_t limit);

// Reads the four files of the data set from `dir`: NAME.gz, else NAME
// uncompressed. Throws DataError.
FashionMnist loadFashionMnist(const std::string& dir, size_t trainLimit, size_t testLimit);

// Fashion-MNIST's pixel mean and standard deviation over the training set,
// in [0, 1] units: inputs are standardized with them.
inline constexpr float kPixelMean = 0.2860f;
inline constexpr float kPixelStd = 0.3530f;

// Writes images `indices[0..n)` of `data` as standardized floats, one row each.
void gatherBatch(const LabeledImages& data, const uint32_t* indices, size_t n, float* out,
                 uint8_t* labels);

}  // namespace trainer

#endif  // BRAID_TOOLS_TRAINER_DATASET_H_
