// What every fuzz target shares: a failed check is a crash (libFuzzer saves
// the input), and a Result that failed must say why.
#pragma once

#include <unistd.h>  // environ

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "src/common/status.h"

namespace braid::fuzz {

[[noreturn]] inline void fail(const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what);
  std::abort();
}

#define FUZZ_CHECK(condition) \
  ((condition) ? (void)0 : ::braid::fuzz::fail(#condition, __FILE__, __LINE__))

// A failure is reported with an error code and a message, never as an empty
// Result whose status says ok (which a caller would take for success).
template <typename T>
void checkResult(const Result<T>& result) {
  if (result.isOk()) return;
  FUZZ_CHECK(!result.status().isOk());
  FUZZ_CHECK(!result.status().message().empty());
}
inline void checkStatus(const Status& status) {
  if (!status.isOk()) FUZZ_CHECK(!status.message().empty());
}

// Unsets every BRAID_* variable, and the launchers' that braid reads.
inline void clearLaunchEnvironment() {
  static const char* kLaunchers[] = {"RANK",         "WORLD_SIZE",           "MASTER_ADDR",
                                     "MASTER_PORT",  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                     "SLURM_PROCID", "SLURM_NTASKS"};
  std::vector<std::string> names;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    if (entry.rfind("BRAID_", 0) == 0) names.push_back(entry.substr(0, entry.find('=')));
  }
  for (const auto& name : names) unsetenv(name.c_str());
  for (const char* name : kLaunchers) unsetenv(name);
}

}  // namespace braid::fuzz
