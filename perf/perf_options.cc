#include "perf_options.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cxxopts.hpp>
#include <filesystem>
#include <stdexcept>

namespace braid::perf {
namespace {

// In nccl-tests' order, so that the rows of `-d all` and `-o all` line up
// with an nccl-tests log of the same sweep.
constexpr DataType kDataTypes[] = {
    {"int8", braidInt8, 1, false, true, 127, 0},
    {"uint8", braidUint8, 1, false, false, 255, 0},
    {"int32", braidInt32, 4, false, true, 2147483647.0, 0},
    {"uint32", braidUint32, 4, false, false, 4294967295.0, 0},
    {"int64", braidInt64, 8, false, true, 9.2e18, 0},
    {"uint64", braidUint64, 8, false, false, 1.8e19, 0},
    {"half", braidFloat16, 2, true, true, 2048, 10},
    {"float", braidFloat32, 4, true, true, 16777216.0, 23},
    {"double", braidFloat64, 8, true, true, 9007199254740992.0, 52},
    {"bfloat16", braidBfloat16, 2, true, true, 256, 7},
};

constexpr RedOp kRedOps[] = {{"sum", braidSum},
                             {"prod", braidProd},
                             {"max", braidMax},
                             {"min", braidMin},
                             {"avg", braidAvg}};

}  // namespace

std::span<const DataType> dataTypes() {
  return kDataTypes;
}

Options parseOptions(int argc, char** argv, const Collective& collective) {
  Options options;
  options.commandLine.assign(argv, argv + argc);
  cxxopts::Options spec(collective.name, "braid collective benchmark (nccl-tests conventions)");
  auto text = [](const char* value) { return cxxopts::value<std::string>()->default_value(value); };
  auto number = [](const char* value) { return cxxopts::value<int>()->default_value(value); };
  cxxopts::OptionAdder add = spec.add_options();
  add("b,minbytes", "smallest size (K/M/G suffixes)", text("32M"));
  add("e,maxbytes", "largest size", text("32M"));
  add("i,stepbytes", "additive size step, used when stepfactor is 1", text("1M"));
  add("f,stepfactor", "multiplicative size step, used when above 1", number("1"));
  add("n,iters", "timed iterations per size", number("20"));
  add("w,warmup_iters", "untimed iterations before each measurement", number("1"));
  add("m,agg_iters",
      "calls per iteration, issued in one group (braidGroupStart/End) when above 1; the time "
      "reported is per call",
      number("1"));
  add("c,check", "checked iterations per measurement (0: no check)", number("1"));
  add("d,datatype", "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 all",
      text("float"));
  add("o,op", "sum prod max min avg all (tests that reduce)", text("sum"));
  add("r,root", "root rank, or all (tests with a root)", text("0"));
  add("a,average", "time reported: 0 rank 0, 1 average, 2 minimum, 3 maximum over ranks",
      number("1"));
  // The default differs from nccl-tests' (0): braid's published figures are
  // of calls on the caller's thread, the path most callers take.
  add("z,blocking",
      "1: every call completes before it returns (stream NULL); 0: each timed batch of calls "
      "is queued on a braid stream and waited for once",
      number("1"));
  add("A,algorithm", "1: add a column naming the algorithm braid chose", number("0"));
  add("R,local_register",
      "1: take the send and receive buffers from braidHostAlloc, or with --mem cuda from "
      "braidMemAlloc (ranks of a host read them in place), and declare them with "
      "braidCommRegister (RDMA reads them in one read)",
      number("0"));
  add("M,mem",
      "host: the calls' buffers are host memory; cuda: GPU memory (cuMemAlloc on GPU rank "
      "modulo the GPUs a process sees), filled and checked through host copies",
      text("host"));
  add("J,json", "rank 0 writes the whole run to this JSON file", text(""));
  add("h,help", "print this help");
  spec.add_options("Testing")(
      "corrupt_rank",
      "test only: this rank alters one element of each result it checks, so that the run "
      "must report it as wrong",
      number("-1"));
  cxxopts::ParseResult args = spec.parse(argc, argv);
  if (args.count("help")) {
    std::fputs(spec.help({"", "Testing"}).c_str(), stdout);
    std::exit(0);
  }
  if (!args.unmatched().empty())
    throw std::invalid_argument("unexpected '" + args.unmatched()[0] + "'");

  options.iters = args["iters"].as<int>();
  options.warmupIters = args["warmup_iters"].as<int>();
  options.aggIters = args["agg_iters"].as<int>();
  options.checkIters = args["check"].as<int>();
  options.average = args["average"].as<int>();
  // 0 or 1 each: nccl-tests' -z 2/3 and -R 2 (symmetric registration) are
  // modes braid does not have, refused rather than run as 1 under their name.
  auto zeroOrOne = [&](const char* name, const char* others) {
    const int value = args[name].as<int>();
    if (value != 0 && value != 1)
      throw std::invalid_argument(std::string(name) + " is 0 or 1, not " + std::to_string(value) +
                                  others);
    return value == 1;
  };
  options.blocking = zeroOrOne("blocking", "") ? 1 : 0;
  options.showAlgorithm = zeroOrOne("algorithm", "");
  options.localRegister =
      zeroOrOne("local_register", " (braid has no symmetric registration, nccl-tests' 2)");
  options.jsonPath = args["json"].as<std::string>();
  if (!options.jsonPath.empty()) {
    // Found out now, not when the sweep is done and its results have nowhere to go.
    const std::filesystem::path parent = std::filesystem::absolute(options.jsonPath).parent_path();
    if (::access(parent.c_str(), W_OK) != 0)
      throw std::invalid_argument("json: cannot write in " + parent.string() + ": " +
                                  std::strerror(errno));
  }
  const std::string mem = args["mem"].as<std::string>();
  if (mem != "host" && mem != "cuda")
    throw std::invalid_argument("mem is host or cuda, not '" + mem + "'");
  options.cudaMemory = mem == "cuda";
  options.corruptRank = args["corrupt_rank"].as<int>();
  if (options.iters < 1 || options.warmupIters < 0 || options.checkIters < 0) {
    throw std::invalid_argument("iters must be >= 1, warmup_iters and check >= 0");
  }
  if (options.aggIters < 1) throw std::invalid_argument("agg_iters must be >= 1");
  if (static_cast<int64_t>(options.iters) * options.aggIters > INT32_MAX)
    throw std::invalid_argument("iters times agg_iters is more than 2^31 timed calls");
  if (options.average < 0 || options.average > 3) throw std::invalid_argument("average is 0..3");

  options.typeArg = args["datatype"].as<std::string>();
  for (const DataType& type : kDataTypes) {
    if (options.typeArg == "all" || options.typeArg == type.name) options.types.push_back(&type);
  }
  if (options.types.empty())
    throw std::invalid_argument("unknown datatype '" + options.typeArg + "'");
  options.opArg = args["op"].as<std::string>();
  for (const RedOp& op : kRedOps) {
    if (options.opArg == "all" || options.opArg == op.name) options.ops.push_back(op);
  }
  if (options.ops.empty()) throw std::invalid_argument("unknown op '" + options.opArg + "'");
  if (!collective.usesOp) options.ops = {kRedOps[0]};  // a placeholder, printed as "none"

  options.rootArg = args["root"].as<std::string>();
  if (options.rootArg == "all") {
    options.allRoots = true;
  } else {
    size_t end = 0;
    try {
      options.root = std::stoi(options.rootArg, &end);
    } catch (const std::exception&) {
      end = 0;
    }
    if (end == 0 || end != options.rootArg.size())
      throw std::invalid_argument("root is a rank or 'all', not '" + options.rootArg + "'");
  }

  // As in nccl-tests: a factor above 1 makes the sweep multiplicative, else
  // it grows by stepbytes.
  options.minBytes = parseBytes(args["minbytes"].as<std::string>());
  options.maxBytes = parseBytes(args["maxbytes"].as<std::string>());
  options.stepBytes = parseBytes(args["stepbytes"].as<std::string>());
  options.stepFactor = args["stepfactor"].as<int>();
  const bool additive = options.stepFactor <= 1;
  if (options.minBytes > options.maxBytes)
    throw std::invalid_argument("minbytes is larger than maxbytes");
  if (options.stepFactor < 1) throw std::invalid_argument("stepfactor must be >= 1");
  if (additive && options.stepBytes == 0) throw std::invalid_argument("stepbytes must be > 0");
  // More sizes than anyone runs is a mistake in the flags: refused, rather
  // than built and run for days.
  constexpr size_t kMostSizes = 1'000'000;
  for (size_t size = options.minBytes; size <= options.maxBytes;) {
    if (options.sweep.size() == kMostSizes)
      throw std::invalid_argument("the sweep has more than " + std::to_string(kMostSizes) +
                                  " sizes; take a larger -i or -f");
    options.sweep.push_back(size);
    size_t next = 0;
    const bool wrapped =
        additive ? __builtin_add_overflow(size, options.stepBytes, &next)
                 : __builtin_mul_overflow(size, static_cast<size_t>(options.stepFactor), &next);
    if (wrapped) break;
    size = std::max(next, size + 1);  // a sweep from 0 bytes still grows
  }
  options.stepText = additive ? std::to_string(options.stepBytes) + "(bytes)"
                              : std::to_string(options.stepFactor) + "(factor)";
  return options;
}

}  // namespace braid::perf
