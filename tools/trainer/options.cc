// braid-train's command line: the options and their help text, and the
// checked Config that training runs from. Kept out of main.cc, which holds
// the training loop, since parsing what the user typed is a separate idea
// (see options.h).
#include "options.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "dataset.h"

namespace trainer {
namespace {

std::vector<int> parseWidths(const std::string& text) {
  std::vector<int> widths;
  if (text.empty() || text == "none") return widths;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < 1 || value > 1 << 16)
      throw UsageError("--hidden: '" + item + "' is not a layer width (1..65536)");
    widths.push_back(int(value));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return widths;
}

}  // namespace

cxxopts::Options makeOptions() {
  cxxopts::Options options(
      "braid-train",
      "Trains an MLP on Fashion-MNIST, data parallel over braid ranks.\n"
      "Run N ranks with `braidrun -n N braid-train [options]`; without a launcher it runs as one "
      "rank.\nEvery global batch is split across the ranks; gradients are summed with braid "
      "collectives\nwhile the backward pass goes on, so N ranks compute what one rank with the "
      "same --batch would.\n");
  options.set_width(100);
  // clang-format off
  options.add_options("Data")
    ("data", "directory with the four Fashion-MNIST IDX files (.gz or plain)",
     cxxopts::value<std::string>()->default_value(kDefaultDataDir), "DIR")
    ("train-samples", "use only the first N training images (0: all 60000)",
     cxxopts::value<size_t>()->default_value("0"), "N")
    ("test-samples", "use only the first N test images (0: all 10000)",
     cxxopts::value<size_t>()->default_value("0"), "N");
  options.add_options("Model and training")
    ("hidden", "hidden layer widths, comma separated ('none': a linear model)",
     cxxopts::value<std::string>()->default_value("256,256"), "W,W")
    ("epochs", "passes over the training set", cxxopts::value<int64_t>()->default_value("10"), "N")
    ("steps", "stop after N optimizer steps in all, as if interrupted: the schedule still "
     "spans --epochs (0: run every epoch)",
     cxxopts::value<int64_t>()->default_value("0"), "N")
    ("batch", "global batch size, split across the ranks (rank r of N takes samples "
     "[r*B/N, (r+1)*B/N) of each batch)", cxxopts::value<int64_t>()->default_value("64"), "B")
    ("optimizer", "sgd (with momentum) or adam", cxxopts::value<std::string>()->default_value("adam"),
     "NAME")
    ("lr", "learning rate (default: 0.001 for adam, 0.02 for sgd)", cxxopts::value<float>(), "X")
    ("schedule", "learning rate over the run: cosine (from --lr down to 0 at the last step "
     "of --epochs) or constant", cxxopts::value<std::string>()->default_value("cosine"),
     "NAME")
    ("momentum", "sgd momentum", cxxopts::value<float>()->default_value("0.9"), "X")
    ("beta1", "adam: decay of the first moment", cxxopts::value<float>()->default_value("0.9"), "X")
    ("beta2", "adam: decay of the second moment", cxxopts::value<float>()->default_value("0.999"),
     "X")
    ("eps", "adam: added to the root of the second moment",
     cxxopts::value<float>()->default_value("1e-8"), "X")
    ("weight-decay", "L2 penalty added to the gradient", cxxopts::value<float>()->default_value("0"),
     "X")
    ("seed", "seed of the initial weights and of the order of samples; a run is reproducible "
     "for a given seed, batch and number of ranks", cxxopts::value<uint64_t>()->default_value("1"),
     "N")
    ("threads", "BLAS threads per rank. Run more ranks rather than threads: OpenBLAS rounds "
     "differently with other thread counts, so only runs with equal --threads match to the last "
     "bit", cxxopts::value<int>()->default_value("1"), "N");
  options.add_options("Data parallelism")
    ("sync", "allreduce: every rank sums the gradients (AllReduce) and steps its optimizer; "
     "ps: parameter-server pattern, Reduce to rank 0, which steps, then Broadcast of the weights",
     cxxopts::value<std::string>()->default_value("allreduce"), "MODE")
    ("compress", "none: gradient sums travel in fp64, as they are computed, and N ranks end "
     "with one rank's weights; fp32 or bf16: rounded to that type for the collective (half or a "
     "quarter of the bytes) and widened back", cxxopts::value<std::string>()->default_value("none"),
     "MODE")
    ("bucket-kb", "size of a gradient bucket on the wire: the gradients, from the last layer "
     "back, are exchanged in collectives of this many KiB, each as soon as backward has computed "
     "it (0: one collective for all)", cxxopts::value<size_t>()->default_value("512"), "KB")
    ("no-overlap", "exchange gradients only after the whole backward pass, blocking (to measure "
     "what overlapping saves)");
  options.add_options("Output")
    ("log", "write a CSV row per epoch (loss, accuracies, times) to FILE",
     cxxopts::value<std::string>(), "FILE")
    ("plot", "draw the loss and accuracy curves into FILE.png with gnuplot after each epoch",
     cxxopts::value<std::string>(), "FILE")
    ("checkpoint", "after each epoch, save weights, optimizer state and history to FILE "
     "(atomically)", cxxopts::value<std::string>(), "FILE")
    ("resume", "continue from the --checkpoint file if it exists; the run then ends as an "
     "uninterrupted one would")
    ("save-weights", "write the final weights to FILE (for --compare)",
     cxxopts::value<std::string>(), "FILE")
    ("progress", "auto (a bar on a terminal, else a line per quarter epoch), bar, lines or none",
     cxxopts::value<std::string>()->default_value("auto"), "MODE");
  options.add_options("Comparing weight files (no training)")
    ("compare", "compare the weights in FILE with --reference and exit: 0 when the largest "
     "relative difference is within --tolerance, 1 otherwise", cxxopts::value<std::string>(),
     "FILE")
    ("reference", "the weights FILE that --compare measures against",
     cxxopts::value<std::string>(), "FILE")
    ("tolerance", "largest accepted relative difference, see --floor",
     cxxopts::value<double>()->default_value("1e-5"), "X")
    ("floor", "the relative difference of element i is |a_i - b_i| / max(|b_i|, X) with b the "
     "reference, so that weights near zero are compared on an absolute scale of X",
     cxxopts::value<double>()->default_value("1e-3"), "X");
  options.add_options()("h,help", "show this help");
  // clang-format on
  return options;
}

std::string helpText(cxxopts::Options& options) {
  return options.help({"", "Data", "Model and training", "Data parallelism", "Output",
                       "Comparing weight files (no training)"});
}

namespace {

// The path of flag `name`, whose file the run writes later (after an epoch,
// or at its end): a directory that does not exist or cannot be written is
// refused now, before any training, not found after the first epoch.
std::string writablePath(const cxxopts::ParseResult& args, const char* name) {
  const std::string path = args[name].as<std::string>();
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string directory = parent.empty() ? "." : parent.string();
  std::error_code error;
  if (!std::filesystem::is_directory(directory, error))
    throw UsageError(std::string("--") + name + ": the directory '" + directory +
                     "' does not exist");
  if (::access(directory.c_str(), W_OK) != 0)
    throw UsageError(std::string("--") + name + ": the directory '" + directory +
                     "' cannot be written");
  return path;
}

}  // namespace

Config parseConfig(const cxxopts::ParseResult& args) {
  Config c;
  c.dataDir = args["data"].as<std::string>();
  c.trainSamples = args["train-samples"].as<size_t>();
  c.testSamples = args["test-samples"].as<size_t>();
  c.hidden = parseWidths(args["hidden"].as<std::string>());
  c.epochs = args["epochs"].as<int64_t>();
  c.maxSteps = args["steps"].as<int64_t>();
  c.batch = args["batch"].as<int64_t>();
  if (c.epochs < 1) throw UsageError("--epochs must be at least 1");
  if (c.maxSteps < 0) throw UsageError("--steps must not be negative");
  if (c.batch < 1 || c.batch > 1 << 20) throw UsageError("--batch must be in 1..1048576");

  const std::string optimizer = args["optimizer"].as<std::string>();
  if (optimizer == "sgd") {
    c.optimizer.kind = OptimizerKind::kSgd;
    c.optimizer.learningRate = 0.02f;
  } else if (optimizer == "adam") {
    c.optimizer.kind = OptimizerKind::kAdam;
    c.optimizer.learningRate = 1e-3f;
  } else {
    throw UsageError("--optimizer: '" + optimizer + "' is not sgd or adam");
  }
  if (args.count("lr")) c.optimizer.learningRate = args["lr"].as<float>();
  c.optimizer.momentum = args["momentum"].as<float>();
  c.optimizer.beta1 = args["beta1"].as<float>();
  c.optimizer.beta2 = args["beta2"].as<float>();
  c.optimizer.epsilon = args["eps"].as<float>();
  c.optimizer.weightDecay = args["weight-decay"].as<float>();
  if (!(c.optimizer.learningRate > 0)) throw UsageError("--lr must be positive");
  // torch.optim's ranges: past them the first step makes every weight NaN
  // (Adam divides by 1 - beta), which a run would train on and report.
  if (!(c.optimizer.beta1 >= 0 && c.optimizer.beta1 < 1))
    throw UsageError("--beta1 must be in [0, 1)");
  if (!(c.optimizer.beta2 >= 0 && c.optimizer.beta2 < 1))
    throw UsageError("--beta2 must be in [0, 1)");
  if (!(c.optimizer.epsilon >= 0)) throw UsageError("--eps must not be negative");
  if (!(c.optimizer.momentum >= 0)) throw UsageError("--momentum must not be negative");
  if (!(c.optimizer.weightDecay >= 0)) throw UsageError("--weight-decay must not be negative");
  const std::string schedule = args["schedule"].as<std::string>();
  if (schedule != "cosine" && schedule != "constant")
    throw UsageError("--schedule: '" + schedule + "' is not cosine or constant");
  c.cosine = schedule == "cosine";
  c.seed = args["seed"].as<uint64_t>();
  c.threads = args["threads"].as<int>();
  if (c.threads < 1 || c.threads > 1024) throw UsageError("--threads must be in 1..1024");

  const std::string sync = args["sync"].as<std::string>();
  if (sync == "allreduce")
    c.sync = SyncMode::kAllReduce;
  else if (sync == "ps")
    c.sync = SyncMode::kParameterServer;
  else
    throw UsageError("--sync: '" + sync + "' is not allreduce or ps");
  const std::string compress = args["compress"].as<std::string>();
  if (compress == "none")
    c.compression = Compression::kNone;
  else if (compress == "fp32")
    c.compression = Compression::kFp32;
  else if (compress == "bf16")
    c.compression = Compression::kBf16;
  else
    throw UsageError("--compress: '" + compress + "' is not none, fp32 or bf16");
  c.bucketBytes = args["bucket-kb"].as<size_t>() * 1024;
  c.overlap = args.count("no-overlap") == 0;

  if (args.count("log")) c.logPath = writablePath(args, "log");
  if (args.count("plot")) c.plotPath = writablePath(args, "plot");
  if (args.count("checkpoint")) c.checkpointPath = writablePath(args, "checkpoint");
  c.resume = args.count("resume") != 0;
  if (c.resume && c.checkpointPath.empty()) throw UsageError("--resume needs --checkpoint FILE");
  if (args.count("save-weights")) c.saveWeightsPath = writablePath(args, "save-weights");
  c.progress = args["progress"].as<std::string>();
  if (c.progress != "auto" && c.progress != "bar" && c.progress != "lines" && c.progress != "none")
    throw UsageError("--progress: '" + c.progress + "' is not auto, bar, lines or none");
  return c;
}

namespace {

// The shortest text that reads back as the same float: "0.001", as typed.
std::string floatText(float value) {
  char text[32];
  auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  return error == std::errc() ? std::string(text, end) : std::to_string(value);
}

}  // namespace

RunSettings runSettings(const Config& c, size_t trainSamples) {
  RunSettings settings{
      {"--train-samples", std::to_string(trainSamples)},
      {"--batch", std::to_string(c.batch)},
      {"--seed", std::to_string(c.seed)},
      {"--optimizer", optimizerName(c.optimizer.kind)},
      {"--lr", floatText(c.optimizer.learningRate)},
  };
  if (c.optimizer.kind == OptimizerKind::kSgd) {
    settings.emplace_back("--momentum", floatText(c.optimizer.momentum));
  } else {
    settings.emplace_back("--beta1", floatText(c.optimizer.beta1));
    settings.emplace_back("--beta2", floatText(c.optimizer.beta2));
    settings.emplace_back("--eps", floatText(c.optimizer.epsilon));
  }
  settings.emplace_back("--weight-decay", floatText(c.optimizer.weightDecay));
  settings.emplace_back("--schedule", c.cosine ? "cosine" : "constant");
  // The cosine rate of a step depends on the run's length; a constant one
  // does not, and a longer run is then the same run, continued.
  if (c.cosine) settings.emplace_back("--epochs", std::to_string(c.epochs));
  settings.emplace_back("--sync", c.sync == SyncMode::kAllReduce ? "allreduce" : "ps");
  const char* compression = c.compression == Compression::kNone   ? "none"
                            : c.compression == Compression::kFp32 ? "fp32"
                                                                  : "bf16";
  settings.emplace_back("--compress", compression);
  return settings;
}

}  // namespace trainer
