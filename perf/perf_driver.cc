// The sweep, the timing, the table: everything of a perf test but the
// collective itself (see perf_driver.h).
#include "perf_driver.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxopts.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace braid::perf {
namespace {

constexpr DataType kDataTypes[] = {
    {"int8", braidInt8, 1, false, true, 127, 0},
    {"uint8", braidUint8, 1, false, false, 255, 0},
    {"int32", braidInt32, 4, false, true, 2147483647.0, 0},
    {"uint32", braidUint32, 4, false, false, 4294967295.0, 0},
    {"int64", braidInt64, 8, false, true, 9.2e18, 0},
    {"uint64", braidUint64, 8, false, false, 1.8e19, 0},
    {"half", braidFloat16, 2, true, true, 2048, 10},
    {"bfloat16", braidBfloat16, 2, true, true, 256, 7},
    {"float", braidFloat32, 4, true, true, 16777216.0, 23},
    {"double", braidFloat64, 8, true, true, 9007199254740992.0, 52},
};

struct RedOp {
  const char* name;
  braidRedOp_t op;
};
constexpr RedOp kRedOps[] = {{"sum", braidSum},
                             {"prod", braidProd},
                             {"min", braidMin},
                             {"max", braidMax},
                             {"avg", braidAvg}};

struct Options {
  std::vector<size_t> sweep;  // the sizes in bytes, in order
  size_t minBytes = 0, maxBytes = 0;
  std::string stepText;  // for the preamble: "2(factor)" or "1048576(bytes)"
  int iters = 20, warmupIters = 1, checkIters = 1, average = 1, blocking = 0, root = 0;
  bool showAlgorithm = false;
  std::vector<const DataType*> types;
  std::vector<RedOp> ops;
};

// "32M" -> 33554432: K, M and G are powers of 1024, as in nccl-tests.
size_t parseBytes(const std::string& text) {
  size_t end = 0;
  const size_t value = text.empty() || text[0] == '-' ? 0 : std::stoull(text, &end);
  const std::string suffix = text.substr(end);
  if (end == 0 || suffix.size() > 1) throw std::invalid_argument("bad size '" + text + "'");
  switch (suffix.empty() ? ' ' : suffix[0]) {
    case ' ':
      return value;
    case 'k':
    case 'K':
      return value << 10;
    case 'm':
    case 'M':
      return value << 20;
    case 'g':
    case 'G':
      return value << 30;
    default:
      throw std::invalid_argument("bad size suffix in '" + text + "'");
  }
}

Options parseOptions(int argc, char** argv, const Collective& collective) {
  cxxopts::Options spec(collective.name, "braid collective benchmark (nccl-tests conventions)");
  auto text = [](const char* value) { return cxxopts::value<std::string>()->default_value(value); };
  auto number = [](const char* value) { return cxxopts::value<int>()->default_value(value); };
  cxxopts::OptionAdder add = spec.add_options();
  add("b,minbytes", "smallest size (K/M/G suffixes)", text("32M"));
  add("e,maxbytes", "largest size", text("32M"));
  add("i,stepbytes", "additive size step", text("1M"));
  add("f,stepfactor", "multiplicative size step", number("2"));
  add("n,iters", "timed iterations per size", number("20"));
  add("w,warmup_iters", "untimed iterations before each measurement", number("1"));
  add("c,check", "checked iterations per measurement (0: no check)", number("1"));
  add("d,datatype", "int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double all",
      text("float"));
  add("o,op", "sum prod min max avg all", text("sum"));
  add("r,root", "root rank", number("0"));
  add("a,average", "time reported: 0 rank 0, 1 average, 2 minimum, 3 maximum over ranks",
      number("1"));
  add("z,blocking", "accepted; every call completes before it returns", number("0"));
  add("A,algorithm", "1: add a column naming the algorithm braid chose", number("0"));
  add("h,help", "print this help");
  cxxopts::ParseResult args = spec.parse(argc, argv);
  if (args.count("help")) {
    std::fputs(spec.help().c_str(), stdout);
    std::exit(0);
  }
  if (!args.unmatched().empty())
    throw std::invalid_argument("unexpected '" + args.unmatched()[0] + "'");

  Options options;
  options.iters = args["iters"].as<int>();
  options.warmupIters = args["warmup_iters"].as<int>();
  options.checkIters = args["check"].as<int>();
  options.average = args["average"].as<int>();
  options.blocking = args["blocking"].as<int>();
  options.root = args["root"].as<int>();
  options.showAlgorithm = args["algorithm"].as<int>() != 0;
  if (options.iters < 1 || options.warmupIters < 0 || options.checkIters < 0) {
    throw std::invalid_argument("iters must be >= 1, warmup_iters and check >= 0");
  }
  if (options.average < 0 || options.average > 3) throw std::invalid_argument("average is 0..3");

  const std::string typeName = args["datatype"].as<std::string>();
  for (const DataType& type : kDataTypes) {
    if (typeName == "all" || typeName == type.name) options.types.push_back(&type);
  }
  if (options.types.empty()) throw std::invalid_argument("unknown datatype '" + typeName + "'");
  const std::string opName = args["op"].as<std::string>();
  for (const RedOp& op : kRedOps) {
    if (opName == "all" || opName == op.name) options.ops.push_back(op);
  }
  if (options.ops.empty()) throw std::invalid_argument("unknown op '" + opName + "'");
  if (!collective.usesOp) options.ops = {kRedOps[0]};  // a placeholder, printed as "none"

  // As in nccl-tests, -i makes the sweep additive; -f is the default.
  const bool additive = args.count("stepbytes") > 0;
  if (additive && args.count("stepfactor") > 0)
    throw std::invalid_argument("use -i or -f, not both");
  const size_t minBytes = options.minBytes = parseBytes(args["minbytes"].as<std::string>());
  const size_t maxBytes = options.maxBytes = parseBytes(args["maxbytes"].as<std::string>());
  const size_t stepBytes = parseBytes(args["stepbytes"].as<std::string>());
  const int stepFactor = args["stepfactor"].as<int>();
  if (minBytes > maxBytes) throw std::invalid_argument("minbytes is larger than maxbytes");
  if (additive ? stepBytes == 0 : stepFactor < 2) throw std::invalid_argument("the step must grow");
  for (size_t size = minBytes; size <= maxBytes;) {
    options.sweep.push_back(size);
    size_t next = additive ? size + stepBytes : std::max(size * stepFactor, size + 1);
    if (next <= size) break;  // overflow
    size = next;
  }
  options.stepText =
      additive ? std::to_string(stepBytes) + "(bytes)" : std::to_string(stepFactor) + "(factor)";
  return options;
}

// Formats like nccl-tests: as many decimals as `width` allows.
std::string fitNumber(double value, int width) {
  int digits = 0;
  for (double power = 1; value >= power && digits < 40; power *= 10) ++digits;
  char text[64];
  if (digits < width - 2)
    std::snprintf(text, sizeof(text), "%*.2f", width, value);
  else if (digits < width - 1)
    std::snprintf(text, sizeof(text), "%*.1f", width, value);
  else if (digits < width + 1)
    std::snprintf(text, sizeof(text), "%*.0f", width, value);
  else
    std::snprintf(text, sizeof(text), "%*.1e", width, value);
  return text;
}

// Page-aligned and never smaller than a page, so that count == 0 has a buffer.
using Buffer = std::unique_ptr<std::byte, decltype(&std::free)>;
Buffer allocateBuffer(size_t bytes) {
  constexpr size_t kAlign = 4096;
  size_t rounded = std::max(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  auto* memory = static_cast<std::byte*>(std::aligned_alloc(kAlign, rounded));
  if (memory == nullptr) throw std::bad_alloc();
  return Buffer(memory, &std::free);
}

struct Measurement {
  double timeUs = 0;
  int64_t wrong = 0;
  const char* algorithm = "?";  // what braid chose for the timed calls
};

// One process's run of the sweep. A failed braid call ends the process (after
// aborting the communicator, so that the peers fail fast instead of waiting).
class PerfRun {
 public:
  PerfRun(const Collective& collective, const Options& options, braidComm_t comm)
      : collective_(collective), options_(options), comm_(comm) {
    expectOk(braidCommUserRank(comm_, &rank_), "braidCommUserRank");
    expectOk(braidCommCount(comm_, &nranks_), "braidCommCount");
    if (collective_.usesRoot && (options_.root < 0 || options_.root >= nranks_)) {
      throw std::invalid_argument("root " + std::to_string(options_.root) + " is not a rank");
    }
  }

  int run() {
    printPreamble();
    for (const DataType* type : options_.types) {
      // Allocated once, for the largest size; the receive buffer also holds
      // the in-place send data.
      Sizes largest = collective_.sizesFor(options_.sweep.back(), type->size, nranks_);
      Buffer send = allocateBuffer(largest.sendCount * type->size);
      Buffer recv = allocateBuffer(std::max(largest.sendCount, largest.recvCount) * type->size);
      for (const RedOp& op : options_.ops) {
        for (size_t bytes : options_.sweep) {
          TestContext ctx{.comm = comm_,
                          .rank = rank_,
                          .nranks = nranks_,
                          .type = type,
                          .op = op.op,
                          .root = options_.root,
                          .sizes = collective_.sizesFor(bytes, type->size, nranks_)};
          Measurement outOfPlace = measure(ctx, false, send, recv);
          Measurement inPlace = measure(ctx, true, send, recv);
          printRow(ctx, op, outOfPlace, inPlace);
        }
      }
    }
    if (rank_ == 0) {
      std::printf("# %-20s : %d %s\n", "Out of bounds values", failedMeasurements_,
                  failedMeasurements_ ? "FAILED" : "OK");
      std::printf("# %-20s : %g\n", "Avg bus bandwidth", busBwCount_ ? busBwSum_ / busBwCount_ : 0);
      std::printf("#\n# Collective test concluded: %s\n", collective_.name);
    }
    return failedMeasurements_ ? 1 : 0;
  }

 private:
  void expectOk(braidResult_t result, const std::string& what) {
    if (result == braidSuccess) return;
    std::fprintf(stderr, "%s: rank %d: %s failed: %s: %s\n", collective_.name, rank_, what.c_str(),
                 braidGetErrorString(result), braidGetLastError(comm_));
    (void)braidCommAbort(comm_);
    std::exit(1);
  }

  void printPreamble() {
    // Each rank fills its slot; a max-reduction of the zeroed rest gathers them.
    struct RankInfo {
      int32_t pid;
      char host[124];
    };
    std::vector<RankInfo> infos(static_cast<size_t>(nranks_));
    RankInfo& mine = infos[static_cast<size_t>(rank_)];
    std::memset(infos.data(), 0, infos.size() * sizeof(RankInfo));
    mine.pid = static_cast<int32_t>(::getpid());
    ::gethostname(mine.host, sizeof(mine.host) - 1);
    expectOk(braidAllReduce(infos.data(), infos.data(), infos.size() * sizeof(RankInfo), braidUint8,
                            braidMax, comm_, nullptr),
             "braidAllReduce (rank information)");
    if (rank_ != 0) return;
    int version = 0;
    (void)braidGetVersion(&version);
    std::printf("# braid-tests: %s (braid %d.%d.%d)\n", collective_.name, version / 10000,
                version / 100 % 100, version % 100);
    std::printf(
        "# nranks %d minBytes %zu maxBytes %zu step: %s warmup iters: %d iters: %d "
        "validation: %d average: %d\n",
        nranks_, options_.minBytes, options_.maxBytes, options_.stepText.c_str(),
        options_.warmupIters, options_.iters, options_.checkIters, options_.average);
    if (options_.blocking) std::printf("# Blocking: every call completes before it returns\n");
    std::printf("#\n# Using ranks\n");
    for (int r = 0; r < nranks_; ++r) {
      const RankInfo& info = infos[static_cast<size_t>(r)];
      std::printf("#  Rank %2d Pid %6d on %10s\n", r, info.pid, info.host);
    }
    const char* row = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n";
    std::printf(
        "#\n# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place\n",
        "", "", "", "", "");
    std::printf(row, "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                "time", "algbw", "busbw", "#wrong");
    std::printf(row, "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
                "(GB/s)", "(GB/s)", "");
    std::fflush(stdout);
  }

  Measurement measure(const TestContext& ctx, bool inPlace, Buffer& send, Buffer& recv) {
    const size_t eltSize = ctx.type->size;
    const size_t rank = static_cast<size_t>(rank_);
    std::byte* sendPtr =
        inPlace ? recv.get() + ctx.sizes.sendInPlaceOffset * rank * eltSize : send.get();
    std::byte* recvPtr = recv.get() + (inPlace ? ctx.sizes.recvInPlaceOffset * rank * eltSize : 0);
    const std::string what = std::string(inPlace ? "in-place" : "out-of-place") + " run at " +
                             std::to_string(ctx.sizes.bytes) + " B";

    collective_.initData(ctx, sendPtr);
    for (int i = 0; i < options_.warmupIters; ++i)
      expectOk(collective_.run(ctx, sendPtr, recvPtr), what);
    expectOk(braidBarrier(comm_, nullptr), "braidBarrier");
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < options_.iters; ++i) expectOk(collective_.run(ctx, sendPtr, recvPtr), what);
    std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;

    Measurement result;
    result.timeUs = elapsed.count() / options_.iters;
    // Asked before the driver's own AllReduce below replaces the answer.
    (void)braidCommGetLastAlgorithm(comm_, collective_.braidName, &result.algorithm);
    static constexpr braidRedOp_t kTimeReduction[] = {braidSum, braidSum, braidMin, braidMax};
    if (options_.average != 0) {
      expectOk(braidAllReduce(&result.timeUs, &result.timeUs, 1, braidFloat64,
                              kTimeReduction[options_.average], comm_, nullptr),
               "braidAllReduce (time)");
      if (options_.average == 1) result.timeUs /= nranks_;
    }

    // Checked on fresh inputs, into a poisoned receive buffer, so that
    // neither the timed runs' results nor stale data can pass for correct.
    const size_t recvBytes = std::max(ctx.sizes.sendCount, ctx.sizes.recvCount) * eltSize;
    for (int i = 0; i < options_.checkIters; ++i) {
      std::memset(recv.get(), 0xa5, recvBytes);
      collective_.initData(ctx, sendPtr);
      expectOk(collective_.run(ctx, sendPtr, recvPtr), what);
      result.wrong += collective_.check(ctx, recvPtr);
    }
    if (options_.checkIters > 0) {
      expectOk(
          braidAllReduce(&result.wrong, &result.wrong, 1, braidInt64, braidSum, comm_, nullptr),
          "braidAllReduce (#wrong)");
    }
    return result;
  }

  // Whole lines only, so that a failure never leaves half a row behind.
  void printRow(const TestContext& ctx, const RedOp& op, const Measurement& outOfPlace,
                const Measurement& inPlace) {
    char row[256];
    int length =
        std::snprintf(row, sizeof(row), "%12zu  %12zu  %8s  %6s  %6d", ctx.sizes.bytes,
                      ctx.sizes.count, ctx.type->name, collective_.usesOp ? op.name : "none",
                      collective_.usesRoot ? ctx.root : -1);
    for (const Measurement* m : {&outOfPlace, &inPlace}) {
      const double algBw =
          m->timeUs > 0 ? static_cast<double>(ctx.sizes.algBytes) / m->timeUs / 1e3 : 0;
      const double busBw = algBw * collective_.busBwFactor(nranks_);
      busBwSum_ += busBw;
      ++busBwCount_;
      failedMeasurements_ += m->wrong > 0 ? 1 : 0;
      std::string wrong = options_.checkIters > 0 ? std::to_string(m->wrong) : "N/A";
      length +=
          std::snprintf(row + length, sizeof(row) - static_cast<size_t>(length),
                        "  %7s  %6s  %6s  %6s", fitNumber(m->timeUs, 7).c_str(),
                        fitNumber(algBw, 6).c_str(), fitNumber(busBw, 6).c_str(), wrong.c_str());
    }
    if (rank_ != 0) return;
    if (options_.showAlgorithm)
      length += std::snprintf(row + length, sizeof(row) - static_cast<size_t>(length), "  %s",
                              outOfPlace.algorithm);
    std::printf("%s\n", row);
    std::fflush(stdout);
  }

  const Collective& collective_;
  const Options& options_;
  braidComm_t comm_;
  int rank_ = 0;
  int nranks_ = 1;
  int failedMeasurements_ = 0;  // (size, placement) pairs with #wrong > 0
  double busBwSum_ = 0;
  int busBwCount_ = 0;
};

}  // namespace

int perfMain(int argc, char** argv, const Collective& collective) {
  Options options;
  try {
    options = parseOptions(argc, argv, collective);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s (see --help)\n", collective.name, error.what());
    return 2;
  }
  braidComm_t comm = nullptr;
  if (braidResult_t result = braidCommInitFromEnv(&comm); result != braidSuccess) {
    std::fprintf(stderr, "%s: braidCommInitFromEnv failed: %s: %s\n", collective.name,
                 braidGetErrorString(result), braidGetLastError(nullptr));
    return 1;
  }
  int exitCode = 1;
  try {
    exitCode = PerfRun(collective, options, comm).run();
  } catch (const std::exception& error) {  // a bad root, an allocation that failed
    std::fprintf(stderr, "%s: %s\n", collective.name, error.what());
    (void)braidCommAbort(comm);
  }
  if (braidResult_t result = braidCommDestroy(comm); result != braidSuccess) {
    std::fprintf(stderr, "%s: braidCommDestroy failed: %s: %s\n", collective.name,
                 braidGetErrorString(result), braidGetLastError(nullptr));
    exitCode = 1;
  }
  return exitCode;
}

}  // namespace braid::perf
