// braid-train: data-parallel training of an MLP on Fashion-MNIST, the
// reference consumer of braid's C ABI (it uses braid.h and nothing else of
// braid).
//
//   braidrun -n 2 braid-train --epochs 10 --log train.csv --plot train.png
#include <braid.h>
#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxopts.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "data_parallel.h"
#include "dataset.h"
#include "host_buffer.h"
#include "mlp.h"
#include "optimizer.h"
#include "options.h"
#include "report.h"

namespace trainer {
namespace {

constexpr int kUsageExit = 2;
constexpr int kDataExit = 66;  // EX_NOINPUT: the input data is missing or unreadable
constexpr int kEvalChunk = 512;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Metric of --compare; see docs/TRAINER.md.
int compareWeights(const std::string& path, const std::string& referencePath, double tolerance,
                   double floor) {
  Weights a = readWeights(path);
  Weights b = readWeights(referencePath);
  if (a.sizes != b.sizes || a.params.size() != b.params.size()) {
    std::fprintf(stderr, "braid-train: %s and %s hold different models\n", path.c_str(),
                 referencePath.c_str());
    return 1;
  }
  Mlp shape(a.sizes, 1);
  double worst = 0, worstAbsolute = 0, worstNormwise = 0;
  size_t worstIndex = 0;
  for (const LayerShape& layer : shape.layers()) {
    // Weights and biases of a layer are separate tensors for the norm-wise figure.
    const size_t bounds[3] = {layer.weightOffset, layer.biasOffset, layer.end};
    for (int t = 0; t < 2; ++t) {
      double maxDiff = 0, maxRef = 0;
      for (size_t i = bounds[t]; i < bounds[t + 1]; ++i) {
        const double x = a.params[i], y = b.params[i];
        const double diff = std::fabs(x - y);
        if (std::isnan(x) != std::isnan(y) || !(diff <= diff)) {
          worst = INFINITY;
          worstIndex = i;
          continue;
        }
        const double relative = diff / std::max(std::fabs(y), floor);
        if (relative > worst) worst = relative, worstIndex = i;
        worstAbsolute = std::max(worstAbsolute, diff);
        maxDiff = std::max(maxDiff, diff);
        maxRef = std::max(maxRef, std::fabs(y));
      }
      if (maxRef > 0) worstNormwise = std::max(worstNormwise, maxDiff / maxRef);
    }
  }
  size_t layer = 0;
  while (shape.layers()[layer].end <= worstIndex) ++layer;
  const char* part = worstIndex < shape.layers()[layer].biasOffset ? "weight" : "bias";
  const bool pass = worst <= tolerance;
  std::printf(
      "max relative difference %.3e (|a-b|/max(|b|,%g), at layer %zu %s, index %zu: %.9g vs "
      "%.9g)\n"
      "max absolute difference %.3e; max per-tensor |a-b|inf/|b|inf %.3e\n"
      "%s: %.3e %s tolerance %.1e\n",
      worst, floor, layer + 1, part, worstIndex, double(a.params[worstIndex]),
      double(b.params[worstIndex]), worstAbsolute, worstNormwise, pass ? "PASS" : "FAIL", worst,
      pass ? "<=" : ">", tolerance);
  return pass ? 0 : 1;
}

// "784-256-256-10"
std::string layerText(const std::vector<int>& sizes) {
  std::string out;
  for (int w : sizes) {
    if (!out.empty()) out += '-';
    out += std::to_string(w);
  }
  return out;
}

bool launchedAsRank() {
  for (const char* name : {"BRAID_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

// Samples of the global batch that rank r of n takes: [r*B/n, (r+1)*B/n).
int64_t shareBegin(int64_t batch, int rank, int ranks) {
  return batch * rank / ranks;
}

// The order of samples in an epoch: a Fisher-Yates shuffle driven by
// mt19937_64 and an unbiased bounded draw, both fully specified, so that every
// rank and every run draws the same permutation for (seed, epoch).
std::vector<uint32_t> epochOrder(size_t count, uint64_t seed, int64_t epoch) {
  std::seed_seq sequence{uint32_t(seed), uint32_t(seed >> 32), uint32_t(epoch),
                         uint32_t(uint64_t(epoch) >> 32)};
  std::mt19937_64 engine(sequence);
  std::vector<uint32_t> order(count);
  for (size_t i = 0; i < count; ++i) order[i] = uint32_t(i);
  for (size_t i = count; i > 1; --i) {
    const uint64_t bound = i;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t draw;
    do draw = engine();
    while (draw >= limit);
    std::swap(order[i - 1], order[draw % bound]);
  }
  return order;
}

struct Totals {
  double lossSum = 0;
  double correct = 0;
  double samples = 0;
};

class Trainer {
 public:
  Trainer(const Config& config, FashionMnist data, braidComm_t comm)
      : config_(config), data_(std::move(data)), comm_(comm) {
    check(braidCommUserRank(comm_, &rank_), "braidCommUserRank");
    check(braidCommCount(comm_, &ranks_), "braidCommCount");
    std::vector<int> sizes{int(data_.train.features())};
    sizes.insert(sizes.end(), config_.hidden.begin(), config_.hidden.end());
    sizes.push_back(kClasses);
    localMax_ = int((config_.batch + ranks_ - 1) / ranks_);
    model_.emplace(sizes, std::max(localMax_, kEvalChunk));
    params_.resize(model_->parameterCount());
    grads_.resize(model_->parameterCount());
    labels_.resize(size_t(std::max(localMax_, kEvalChunk)));
    // In ps mode only rank 0 steps, so only rank 0 keeps optimizer state.
    const bool stepsHere = config_.sync == SyncMode::kAllReduce || rank_ == 0;
    optimizer_.emplace(config_.optimizer, stepsHere ? model_->parameterCount() : 0);
    bucketValues_ = config_.bucketBytes / wireBytes(config_.compression);
    exchange_.emplace(comm_, config_.sync, config_.compression, config_.overlap,
                      makeBuckets(model_->parameterCount(), bucketValues_),
                      model_->parameterCount());
  }

  int run() {
    const int threads = config_.threads;
    openblas_set_num_threads(threads);

    if (rank_ == 0) model_->initialize(params_.data(), config_.seed);
    check(braidBroadcast(params_.data(), params_.data(), params_.size(), braidFloat32, 0, comm_,
                         nullptr),
          "braidBroadcast (initial weights)");
    if (config_.resume && !resume()) return 1;

    const int64_t stepsPerEpoch = int64_t(data_.train.count) / config_.batch;
    if (stepsPerEpoch < 1) {
      if (rank_ == 0)
        std::fprintf(stderr, "braid-train: --batch %lld is larger than the %zu training samples\n",
                     (long long)config_.batch, data_.train.count);
      return kUsageExit;
    }
    totalSteps_ = stepsPerEpoch * config_.epochs;
    if (rank_ == 0) describe(stepsPerEpoch, threads);

    for (int64_t epoch = epochsDone_ + 1; epoch <= config_.epochs; ++epoch) {
      if (config_.maxSteps > 0 && steps_ >= config_.maxSteps) break;
      int64_t steps = stepsPerEpoch;
      if (config_.maxSteps > 0) steps = std::min(steps, config_.maxSteps - steps_);
      EpochRecord record = trainEpoch(epoch, steps, stepsPerEpoch);
      history_.push_back(record);
      if (steps == stepsPerEpoch) {
        epochsDone_ = epoch;
        if (!config_.checkpointPath.empty() && rank_ == 0) saveCheckpoint();
      }
      if (rank_ == 0) writeOutputs();
    }
    if (!checkRanksAgree()) return 1;
    if (!config_.saveWeightsPath.empty() && rank_ == 0) {
      writeWeights(config_.saveWeightsPath, Weights{model_->sizes(), params_});
      std::printf("weights written to %s\n", config_.saveWeightsPath.c_str());
    }
    return 0;
  }

 private:
  void describe(int64_t stepsPerEpoch, int threads) {
    const std::string widths = layerText(model_->sizes());
    const int fewest = int(config_.batch / ranks_);
    const std::string share = fewest == localMax_
                                  ? std::to_string(fewest)
                                  : std::to_string(fewest) + "-" + std::to_string(localMax_);
    std::printf(
        "braid-train: MLP %s (%zu parameters), %s lr %g%s, global batch %lld on %d rank%s "
        "(%s samples each), %lld steps per epoch, %zu training / %zu test samples\n",
        widths.c_str(), params_.size(), optimizerName(config_.optimizer.kind),
        double(config_.optimizer.learningRate), config_.cosine ? " (cosine)" : "",
        (long long)config_.batch, ranks_, ranks_ == 1 ? "" : "s", share.c_str(),
        (long long)stepsPerEpoch, data_.train.count, data_.test.count);
    const size_t wire = wireBytes(config_.compression);
    const std::vector<Bucket>& all = exchange_->buckets();
    const std::string buckets =
        std::to_string(all.size()) + " of " + std::to_string(all.front().count * wire / 1024) +
        " KiB" +
        (all.back().count != all.front().count
             ? " (the last " + std::to_string(all.back().count * wire / 1024) + " KiB)"
             : "");
    std::printf("braid-train: %s%s, %s, buckets: %s; %d BLAS thread%s per rank\n",
                config_.sync == SyncMode::kAllReduce ? "AllReduce" : "Reduce + Broadcast (ps)",
                config_.compression == Compression::kBf16   ? " in bf16"
                : config_.compression == Compression::kFp32 ? " in fp32"
                                                            : " in fp64",
                config_.overlap ? "overlapped with backward" : "after backward", buckets.c_str(),
                threads, threads == 1 ? "" : "s");
    std::fflush(stdout);
  }

  EpochRecord trainEpoch(int64_t epoch, int64_t steps, int64_t stepsPerEpoch) {
    const std::vector<uint32_t> order = epochOrder(data_.train.count, config_.seed, epoch);
    const int64_t begin = shareBegin(config_.batch, rank_, ranks_);
    const int n = int(shareBegin(config_.batch, rank_ + 1, ranks_) - begin);
    const int64_t reportEvery = std::max<int64_t>(1, steps / 40);
    const bool terminal = config_.progress == "bar" || (config_.progress == "auto" && ::isatty(1));
    Progress progress(rank_ == 0 && config_.progress != "none", terminal, epoch, config_.epochs,
                      steps);
    const double divisor = double(config_.batch);
    Totals local, global;
    double stats[3];
    exchange_->takeWaitSeconds();
    const double start = now();
    for (int64_t step = 0; step < steps; ++step) {
      const uint32_t* indices = order.data() + step * config_.batch + begin;
      gatherBatch(data_.train, indices, size_t(n), model_->input(begin), labels_.data());
      model_->forward(params_.data(), n);
      BatchStats batch = model_->lossAndGradient(labels_.data(), n);
      model_->backward(params_.data(), n, grads_.data(), bucketValues_,
                       [this](size_t frontier) { exchange_->ready(grads_.data(), frontier); });
      local.lossSum += batch.lossSum;
      local.correct += double(batch.correct);
      local.samples += n;
      const bool report = (step + 1) % reportEvery == 0 || step + 1 == steps;
      if (report) {
        stats[0] = local.lossSum, stats[1] = local.correct, stats[2] = local.samples;
        exchange_->reduceStats(stats, 3);
      }
      exchange_->finish(grads_.data());
      optimizer_->setLearningRate(learningRate(steps_));
      if (config_.sync == SyncMode::kAllReduce) {
        optimizer_->step(params_.data(), grads_.data(), divisor);
      } else {
        if (rank_ == 0) optimizer_->step(params_.data(), grads_.data(), divisor);
        exchange_->broadcastParameters(params_.data(), params_.size());
      }
      ++steps_;
      if (report) {
        global = Totals{stats[0], stats[1], stats[2]};
        progress.update(step + 1, global.samples, global.lossSum / global.samples, now() - start);
      }
    }
    const double seconds = now() - start;
    const double waited = exchange_->takeWaitSeconds();
    progress.done();

    EpochRecord record;
    record.epoch = epoch;
    record.trainLoss = global.lossSum / global.samples;
    record.trainAccuracy = global.correct / global.samples;
    record.seconds = seconds;
    record.communicationSeconds = waited;
    record.computeSeconds = seconds - waited;
    record.samplesPerSecond = global.samples / seconds;
    const double evalStart = now();
    Totals test = evaluate(data_.test);
    record.testLoss = test.lossSum / test.samples;
    record.testAccuracy = test.correct / test.samples;
    if (rank_ == 0) {
      std::printf(
          "epoch %lld/%lld%s  loss %.4f  train acc %.2f%%  test acc %.2f%% (loss %.4f)  "
          "%.2f s: compute %.2f s, communication %.2f s (%.1f%%)  %.0f samples/s  "
          "[eval %.2f s]\n",
          (long long)epoch, (long long)config_.epochs, steps < stepsPerEpoch ? " (partial)" : "",
          record.trainLoss, 100 * record.trainAccuracy, 100 * record.testAccuracy, record.testLoss,
          seconds, record.computeSeconds, waited, 100 * waited / seconds, record.samplesPerSecond,
          now() - evalStart);
      std::fflush(stdout);
    }
    return record;
  }

  // Each rank evaluates its contiguous share of the set; the sums meet by AllReduce.
  Totals evaluate(const LabeledImages& set) {
    const size_t begin = set.count * size_t(rank_) / size_t(ranks_);
    const size_t end = set.count * size_t(rank_ + 1) / size_t(ranks_);
    std::vector<uint32_t> indices(static_cast<size_t>(kEvalChunk));
    double sums[3] = {0, 0, double(end - begin)};
    for (size_t at = begin; at < end; at += kEvalChunk) {
      const int n = int(std::min<size_t>(kEvalChunk, end - at));
      for (int i = 0; i < n; ++i) indices[size_t(i)] = uint32_t(at + size_t(i));
      gatherBatch(set, indices.data(), size_t(n), model_->input(), labels_.data());
      BatchStats s = model_->evaluate(params_.data(), labels_.data(), n);
      sums[0] += s.lossSum;
      sums[1] += double(s.correct);
    }
    check(braidAllReduce(sums, sums, 3, braidFloat64, braidSum, comm_, nullptr),
          "braidAllReduce (evaluation)");
    return Totals{sums[0], sums[1], sums[2]};
  }

  float learningRate(int64_t step) const {
    const double base = config_.optimizer.learningRate;
    if (!config_.cosine) return float(base);
    return float(base * 0.5 * (1.0 + std::cos(M_PI * double(step) / double(totalSteps_))));
  }

  void saveCheckpoint() {
    Checkpoint c;
    c.sizes = model_->sizes();
    c.optimizer = config_.optimizer.kind;
    c.settings = runSettings(config_, data_.train.count);
    c.epochsDone = epochsDone_;
    c.steps = steps_;
    c.optimizerSteps = optimizer_->steps();
    c.params = params_;
    c.first = optimizer_->first();
    c.second = optimizer_->second();
    c.history = history_;
    writeCheckpoint(config_.checkpointPath, c);
  }

  void writeOutputs() {
    if (!config_.logPath.empty()) writeCsv(config_.logPath, history_);
    if (!config_.plotPath.empty() && !plotWarned_) {
      std::string problem = plotCurves(config_.plotPath, history_);
      if (!problem.empty()) {
        std::fprintf(stderr, "braid-train: warning: no plot: %s\n", problem.c_str());
        plotWarned_ = true;
      }
    }
  }

  // Rank 0 reads the checkpoint and sends it to the others, so that only it
  // needs the file. Returns false (after saying why on rank 0) when it is unusable.
  bool resume() {
    // header: usable, found, epochs done, steps, optimizer steps
    int64_t header[5] = {1, 0, 0, 0, 0};
    Checkpoint c;
    if (rank_ == 0) {
      if (::access(config_.checkpointPath.c_str(), F_OK) != 0) {
        std::printf("braid-train: no checkpoint at %s yet; starting from the beginning\n",
                    config_.checkpointPath.c_str());
      } else {
        try {
          c = readCheckpoint(config_.checkpointPath);
          header[1] = 1;
          std::string problem = checkpointMismatch(c);
          if (!problem.empty()) {
            std::fprintf(stderr, "braid-train: cannot resume from %s: %s\n",
                         config_.checkpointPath.c_str(), problem.c_str());
            header[0] = 0;
          }
        } catch (const FileError& e) {
          std::fprintf(stderr, "braid-train: cannot resume: %s\n", e.what());
          header[0] = 0;
        }
        header[2] = c.epochsDone, header[3] = c.steps, header[4] = c.optimizerSteps;
      }
    }
    check(braidBroadcast(header, header, 5, braidInt64, 0, comm_, nullptr),
          "braidBroadcast (checkpoint header)");
    if (header[0] == 0) return false;
    if (header[1] == 0) return true;
    epochsDone_ = header[2];
    steps_ = header[3];
    optimizer_->setSteps(header[4]);
    if (rank_ == 0) {
      params_ = c.params;
      optimizer_->first() = c.first;
      optimizer_->second() = c.second;
      history_ = c.history;
    }
    check(braidBroadcast(params_.data(), params_.data(), params_.size(), braidFloat32, 0, comm_,
                         nullptr),
          "braidBroadcast (checkpoint weights)");
    if (config_.sync == SyncMode::kAllReduce) {
      for (std::vector<float>* state : {&optimizer_->first(), &optimizer_->second()})
        check(braidBroadcast(state->data(), state->data(), state->size(), braidFloat32, 0, comm_,
                             nullptr),
              "braidBroadcast (optimizer state)");
    }
    if (rank_ == 0)
      std::printf("braid-train: resumed from %s after epoch %lld (%lld steps)\n",
                  config_.checkpointPath.c_str(), (long long)epochsDone_, (long long)steps_);
    return true;
  }

  std::string checkpointMismatch(const Checkpoint& c) const {
    if (c.sizes != model_->sizes())
      return "it holds an MLP " + layerText(c.sizes) + ", this run trains " +
             layerText(model_->sizes());
    if (c.optimizer != config_.optimizer.kind)
      return std::string("it was trained with ") + optimizerName(c.optimizer) + ", this run uses " +
             optimizerName(config_.optimizer.kind);
    if (c.params.size() != params_.size() || c.first.size() != optimizer_->first().size() ||
        c.second.size() != optimizer_->second().size())
      return "its parameter or optimizer state sizes do not match this run";
    const RunSettings mine = runSettings(config_, data_.train.count);
    std::string changed;
    for (const auto& setting : mine) {
      // Not a structured binding: clang before 16 cannot capture one.
      const std::string& name = setting.first;
      const std::string& value = setting.second;
      auto saved = std::find_if(c.settings.begin(), c.settings.end(),
                                [&](const auto& other) { return other.first == name; });
      if (saved != c.settings.end() && saved->second == value) continue;
      changed += (changed.empty() ? "" : ", ") + name + " " + value + " (the checkpoint's: " +
                 (saved == c.settings.end() ? std::string("none") : name + " " + saved->second) +
                 ")";
    }
    if (!changed.empty())
      return "this run has " + changed +
             ", and would go on as another run; resume with the checkpoint's settings, or give "
             "--checkpoint a new file";
    return "";
  }

  // Every rank must end with the same weights; an elementwise max and min
  // over ranks that differ anywhere would show ranks that drifted apart.
  bool checkRanksAgree() {
    if (ranks_ == 1) return true;
    std::vector<float> high(params_.size()), low(params_.size());
    check(braidAllReduce(params_.data(), high.data(), params_.size(), braidFloat32, braidMax, comm_,
                         nullptr),
          "braidAllReduce (weight check)");
    check(braidAllReduce(params_.data(), low.data(), params_.size(), braidFloat32, braidMin, comm_,
                         nullptr),
          "braidAllReduce (weight check)");
    if (std::memcmp(high.data(), low.data(), high.size() * sizeof(float)) == 0) return true;
    if (rank_ == 0) std::fprintf(stderr, "braid-train: the ranks ended with different weights\n");
    return false;
  }

  const Config& config_;
  FashionMnist data_;
  braidComm_t comm_;
  int rank_ = 0;
  int ranks_ = 1;
  int localMax_ = 0;
  std::optional<Mlp> model_;
  std::optional<Optimizer> optimizer_;
  std::optional<GradientExchange> exchange_;
  std::vector<float> params_;
  HostBuffer<double> grads_;  // also the wire buffer of uncompressed gradients
  std::vector<uint8_t> labels_;
  std::vector<EpochRecord> history_;
  int64_t epochsDone_ = 0;
  int64_t steps_ = 0;
  int64_t totalSteps_ = 1;
  size_t bucketValues_ = 0;
  bool plotWarned_ = false;
};

braidComm_t initCommunicator() {
  braidComm_t comm = nullptr;
  if (launchedAsRank()) {
    check(braidCommInitFromEnv(&comm), "braidCommInitFromEnv");
  } else {
    braidUniqueId id;
    check(braidGetUniqueId(&id), "braidGetUniqueId");
    check(braidCommInitRank(&comm, 1, id, 0), "braidCommInitRank");
  }
  return comm;
}

int runMain(int argc, char** argv) {
  cxxopts::Options options = makeOptions();
  cxxopts::ParseResult args;
  Config config;
  try {
    args = options.parse(argc, argv);
    if (args.count("help")) {
      std::printf("%s", helpText(options).c_str());
      return 0;
    }
    if (!args.unmatched().empty())
      throw UsageError("unexpected argument '" + args.unmatched()[0] + "'");
    if (args.count("compare")) {
      if (!args.count("reference")) throw UsageError("--compare needs --reference FILE");
      return compareWeights(args["compare"].as<std::string>(), args["reference"].as<std::string>(),
                            args["tolerance"].as<double>(), args["floor"].as<double>());
    }
    config = parseConfig(args);
  } catch (const cxxopts::exceptions::exception& e) {
    std::fprintf(stderr, "braid-train: %s (see --help)\n", e.what());
    return kUsageExit;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "braid-train: %s (see --help)\n", e.what());
    return kUsageExit;
  }

  FashionMnist data;
  try {
    data = loadFashionMnist(config.dataDir, config.trainSamples, config.testSamples);
  } catch (const DataError& e) {
    std::fprintf(stderr, "braid-train: %s\n", e.what());
    return kDataExit;
  }

  braidComm_t comm = initCommunicator();
  int status;
  {
    Trainer trainer(config, std::move(data), comm);
    status = trainer.run();
  }
  check(braidCommDestroy(comm), "braidCommDestroy");
  return status;
}

}  // namespace
}  // namespace trainer

int main(int argc, char** argv) {
  try {
    return trainer::runMain(argc, argv);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "braid-train: %s\n", e.what());
    return 1;
  }
}
