// braid-train's command line: the options and their help text, and the
// checked Config that training runs from. Separate from main.cc because the
// interface a user types is one idea and the training loop another; what
// the options mean is documented here and in docs/TRAINER.md.
#ifndef BRAID_TOOLS_TRAINER_OPTIONS_H_
#define BRAID_TOOLS_TRAINER_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <cxxopts.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "data_parallel.h"
#include "optimizer.h"

namespace trainer {

// A command line that names an unknown mode, a value out of range or an
// option without the one it needs; main reports it with a pointer to --help.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Config {
  std::string dataDir;
  size_t trainSamples = 0;
  size_t testSamples = 0;
  std::vector<int> hidden;
  int64_t epochs = 0;
  int64_t maxSteps = 0;
  int64_t batch = 0;
  OptimizerConfig optimizer;
  bool cosine = true;
  uint64_t seed = 0;
  int threads = 0;
  SyncMode sync = SyncMode::kAllReduce;
  Compression compression = Compression::kNone;
  size_t bucketBytes = 0;
  bool overlap = true;
  std::string logPath;
  std::string plotPath;
  std::string checkpointPath;
  bool resume = false;
  std::string saveWeightsPath;
  std::string progress;
};

// Every option of braid-train, with its default and help text.
cxxopts::Options makeOptions();

// --help's text: the options of makeOptions, group by group.
std::string helpText(cxxopts::Options& options);

// The training options of a parsed command line (not --help or --compare's),
// checked. Throws UsageError.
Config parseConfig(const cxxopts::ParseResult& args);

// What a checkpoint records of `config` and a resumed run must match:
// every option that changes the run's steps, with the training samples
// the data set had (`--train-samples 0` means all of them).
RunSettings runSettings(const Config& config, size_t trainSamples);

}  // namespace trainer

#endif  // BRAID_TOOLS_TRAINER_OPTIONS_H_
