#include "src/launch_env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "src/common/env.h"
#include "src/common/strcat.h"

namespace braid {

namespace {

// Parses a non-negative decimal integer variable; "" when unset.
Result<int> intVariable(const char* name, bool* present) {
  std::string text = envString(name);
  *present = !text.empty();
  if (text.empty()) return 0;
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, 10);
  if (errno || *end != '\0' || v < 0 || v > INT_MAX)
    return invalidArgument(strCat(name, "='", text, "' is not a non-negative integer"));
  return static_cast<int>(v);
}

Result<std::string> rootAddressFromEnv() {
  std::string addr = envString("BRAID_ADDR");
  if (!addr.empty()) return addr;
  std::string host = envString("MASTER_ADDR"), port = envString("MASTER_PORT");
  if (!host.empty() && !port.empty()) {
    // MASTER_PORT is torch.distributed's: torchrun's agent serves its store
    // there (torch 2.4 and later), as does rank 0 of a program's own env://
    // init. braid's rank 0 listens on the port after it.
    bool set = false;
    BRAID_ASSIGN_OR_RETURN(int torchPort, intVariable("MASTER_PORT", &set));
    if (torchPort < 1 || torchPort > 65534)
      return invalidArgument(strCat("MASTER_PORT=", torchPort,
                                    " leaves no port after it for braid's rank 0 (1 to 65534; "
                                    "or set BRAID_ADDR=host:port)"));
    return strCat(host, ":", torchPort + 1);
  }
  return invalidArgument(
      "rank 0's address is not set: set BRAID_ADDR=host:port (or MASTER_ADDR and MASTER_PORT)");
}

}  // namespace

Result<LaunchVariables> launchVariablesFromEnv() {
  struct Source {
    const char *rank, *size, *label;
  };
  const Source sources[] = {{"BRAID_RANK", "BRAID_WORLD_SIZE", "braid"},
                            {"RANK", "WORLD_SIZE", "torchrun"},
                            {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"},
                            {"SLURM_PROCID", "SLURM_NTASKS", "Slurm"}};
  for (const auto& s : sources) {
    bool hasRank = false, hasSize = false;
    BRAID_ASSIGN_OR_RETURN(int rank, intVariable(s.rank, &hasRank));
    BRAID_ASSIGN_OR_RETURN(int size, intVariable(s.size, &hasSize));
    if (!hasRank && !hasSize) continue;
    if (!hasRank || !hasSize)
      return invalidArgument(
          strCat(hasRank ? s.size : s.rank, " is not set but ", hasRank ? s.rank : s.size, " is"));
    if (size < 1 || rank >= size)
      return invalidArgument(strCat(s.rank, "=", rank, " is out of range for ", s.size, "=", size));
    LaunchVariables v{rank, size, "", s.label};
    BRAID_ASSIGN_OR_RETURN(v.address, rootAddressFromEnv());
    return v;
  }
  return invalidArgument(
      "no launcher variables: set BRAID_RANK, BRAID_WORLD_SIZE and BRAID_ADDR (or run under "
      "braidrun, torchrun, mpirun or srun)");
}

}  // namespace braid
