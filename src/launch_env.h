// The launcher's variables, read by braidCommInitFromEnv: this process's
// rank, the number of ranks and rank 0's address, from braidrun, torchrun,
// Open MPI or Slurm (the first complete set wins; docs/ENVIRONMENT.md).
#pragma once

#include <string>

#include "src/common/status.h"

namespace braid {

struct LaunchVariables {
  int rank = 0, size = 0;
  std::string address;  // host:port of rank 0, as given (may name a host)
  std::string source;   // which launcher's variables: "braid", "torchrun", ...
};

Result<LaunchVariables> launchVariablesFromEnv();

}  // namespace braid
