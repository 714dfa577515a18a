// Every value braid reads from the environment: the BRAID_* table
// (loadConfig, then BRAID_ALGO's names against the algorithm registry and
// BRAID_TRANSPORT's against the transports), and the launcher variables of
// braidCommInitFromEnv (rank, size, rank 0's address, BRAID_SECRET). A value
// that does not parse must be an error naming the variable, never a crash
// or a default taken silently.
//
// Input: lines NAME=VALUE, the whole environment while the parsers run.
// Only BRAID_* names and the launchers' are kept; any other line is ignored.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/common/env.h"
#include "src/common/secret.h"
#include "src/launch_env.h"
#include "src/selector.h"
#include "tests/fuzz/fuzz_common.h"
#include "topology/topology.h"
#include "transports/tcp/socket.h"

using braid::fuzz::checkResult;
using braid::fuzz::checkStatus;

namespace {

bool kept(std::string_view name) {
  static constexpr std::string_view kLaunchers[] = {
      "RANK",         "WORLD_SIZE",           "MASTER_ADDR",
      "MASTER_PORT",  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "SLURM_PROCID", "SLURM_NTASKS"};
  if (name.starts_with("BRAID_")) return true;
  for (std::string_view l : kLaunchers)
    if (name == l) return true;
  return false;
}

void parseEnvironment() {
  auto config = braid::loadConfig();
  checkResult(config);
  if (config.isOk()) {
    const braid::Config& c = *config;
    FUZZ_CHECK(c.timeoutSeconds > 0);
    FUZZ_CHECK(c.chunkBytes >= 4096 && c.chunkBytes <= (size_t{1} << 30));
    FUZZ_CHECK(c.shmRingBytes >= 4096 && (c.shmRingBytes & (c.shmRingBytes - 1)) == 0);
    FUZZ_CHECK(c.hostId.size() <= 256);
    FUZZ_CHECK(c.spinMicroseconds == -1 || c.spinMicroseconds >= 0);
    checkStatus(braid::Selector::validate(c.algo));
    if (!c.transport.empty()) FUZZ_CHECK(braid::topo::parseTransport(c.transport).isOk());
  }

  auto launch = braid::launchVariablesFromEnv();
  checkResult(launch);
  if (launch.isOk()) {
    FUZZ_CHECK(launch->size >= 1 && launch->rank >= 0 && launch->rank < launch->size);
    FUZZ_CHECK(!launch->address.empty());
    // As braidCommInitFromEnv parses it, without asking DNS about the input.
    checkResult(braid::tcp::SocketAddress::parseNumeric(launch->address));
  }
  braid::Secret secret{};
  (void)braid::fromHex(braid::envString("BRAID_SECRET"), secret);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> entries;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text.remove_prefix(end == std::string_view::npos ? text.size() : end + 1);
    const size_t eq = line.find('=');
    // The environment holds C strings: a NUL would end the entry early.
    if (eq == std::string_view::npos || line.find('\0') != std::string_view::npos) continue;
    if (kept(line.substr(0, eq))) entries.emplace_back(line);
  }
  // An environment of our own rather than setenv(), whose replaced strings
  // glibc never frees: memory would grow with every input.
  std::vector<char*> environment;
  for (std::string& e : entries) environment.push_back(e.data());
  environment.push_back(nullptr);
  char** const saved = environ;
  environ = environment.data();
  parseEnvironment();
  environ = saved;
  return 0;
}
