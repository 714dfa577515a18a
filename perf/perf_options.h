// The perf tests' command line: nccl-tests' flags, parsed and checked into
// the Options a run follows (perf_driver.cc).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "perf_driver.h"

namespace braid::perf {

// A reduction the perf tests can run, by its nccl-tests name.
struct RedOp {
  const char* name;
  braidRedOp_t op;
};

// What -a reports, by its value: the JSON record's spelling.
inline constexpr const char* kTimeReported[] = {"rank0", "avg", "min", "max"};

struct Options {
  std::vector<size_t> sweep;  // the sizes in bytes, in order
  size_t minBytes = 0, maxBytes = 0, stepBytes = 0;
  int stepFactor = 1;
  std::string stepText;  // for the preamble: "2(factor)" or "1048576(bytes)"
  int iters = 20, warmupIters = 1, checkIters = 1, average = 1, blocking = 1;
  int aggIters = 1;  // calls per timed iteration, in one group when above 1
  int root = 0;
  bool allRoots = false;
  bool showAlgorithm = false;
  bool localRegister = false;
  bool cudaMemory = false;  // --mem cuda: the calls' buffers are GPU memory
  std::vector<const DataType*> types;
  std::vector<RedOp> ops;
  std::string typeArg, opArg, rootArg;  // as given, for the JSON record
  std::string jsonPath;
  int corruptRank = -1;
  std::vector<std::string> commandLine;
};

// Every datatype the tests run, in nccl-tests' order (that of `-d all`).
std::span<const DataType> dataTypes();

// Parses argv; throws std::invalid_argument naming a bad flag (and exits 0
// after printing --help).
Options parseOptions(int argc, char** argv, const Collective& collective);

}  // namespace braid::perf
