// The trainer's files: checkpoints (everything a resumed run needs) and
// weight files (the parameters alone, for comparing runs). Both are written
// atomically (temporary file, fsync, rename, fsync of the directory), so a
// crash leaves either the old file or the new one, and both end in a CRC-32
// that reading checks.
#ifndef BRAID_TOOLS_TRAINER_CHECKPOINT_H_
#define BRAID_TOOLS_TRAINER_CHECKPOINT_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "optimizer.h"

namespace trainer {

class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct EpochRecord {
  int64_t epoch = 0;  // 1-based
  double trainLoss = 0;
  double trainAccuracy = 0;
  double testLoss = 0;
  double testAccuracy = 0;
  double seconds = 0;  // training steps only, evaluation excluded
  double computeSeconds = 0;
  double communicationSeconds = 0;
  double samplesPerSecond = 0;
};

// The options that shape a run's steps, as ("--name", "value") in a fixed
// order: a resumed run must have the same, or it would go on as another run.
using RunSettings = std::vector<std::pair<std::string, std::string>>;

struct Checkpoint {
  std::vector<int> sizes;
  OptimizerKind optimizer = OptimizerKind::kAdam;
  RunSettings settings;
  int64_t epochsDone = 0;
  int64_t steps = 0;  // global steps taken
  int64_t optimizerSteps = 0;
  std::vector<float> params;
  std::vector<float> first;  // optimizer moments, empty where a rank keeps none
  std::vector<float> second;
  std::vector<EpochRecord> history;
};

// Writes `bytes` to `path` atomically. Throws FileError.
void writeFileAtomically(const std::string& path, const std::string& bytes);

void writeCheckpoint(const std::string& path, const Checkpoint& checkpoint);
// Throws FileError naming the file when it is unreadable, truncated, corrupt
// or not a checkpoint.
Checkpoint readCheckpoint(const std::string& path);

struct Weights {
  std::vector<int> sizes;
  std::vector<float> params;
};

void writeWeights(const std::string& path, const Weights& weights);
Weights readWeights(const std::string& path);

}  // namespace trainer

#endif  // BRAID_TOOLS_TRAINER_CHECKPOINT_H_
