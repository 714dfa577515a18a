// Topology descriptions in the encoded form that every rank publishes at
// init (RankTopology::encode), and what init computes from a table of them:
// the transport of every pair. Each line of the input is one rank's
// description, except the first, which is BRAID_TRANSPORT ("" = automatic).
// Whatever decodes must encode and decode back to itself, and every pair's
// transport must be computed alike from both ends.
#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "topology/topology.h"

using braid::fuzz::checkResult;
namespace topo = braid::topo;

namespace {

constexpr size_t kMaxRanks = 16;

std::vector<std::string_view> lines(std::string_view text) {
  std::vector<std::string_view> out;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    out.push_back(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string_view> input = lines({reinterpret_cast<const char*>(data), size});
  if (input.empty()) return 0;
  const std::string_view forced = input[0];

  std::vector<topo::RankTopology> ranks;
  for (size_t i = 1; i < input.size() && ranks.size() < kMaxRanks; ++i) {
    auto rank = topo::RankTopology::decode(input[i]);
    checkResult(rank);
    if (!rank.isOk()) continue;
    const std::string encoded = rank->encode();
    FUZZ_CHECK(encoded.size() <= topo::kMaxEncodedBytes);
    auto back = topo::RankTopology::decode(encoded);
    FUZZ_CHECK(back.isOk());
    // encode() drops devices, then cores, from a description too long.
    if (back->devices.size() == rank->devices.size() && back->cores == rank->cores)
      FUZZ_CHECK(*back == *rank);
    auto cores = topo::parseCpuList(topo::formatCpuList(rank->cores));
    FUZZ_CHECK(cores.isOk() && *cores == rank->cores);
    (void)rank->summary();
    ranks.push_back(std::move(rank).value());
  }
  if (ranks.empty()) return 0;

  // What this build offers (shm besides tcp), and everything.
  for (const topo::TransportSet& available :
       {topo::TransportSet{false, true, false}, topo::TransportSet{}}) {
    auto matrix = topo::chooseTransports(ranks, available, forced);
    checkResult(matrix);
    if (!matrix.isOk()) continue;
    const int n = static_cast<int>(ranks.size());
    FUZZ_CHECK(matrix->size() == n);
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        FUZZ_CHECK(matrix->at(a, b) == matrix->at(b, a));
        FUZZ_CHECK((a == b) == (matrix->at(a, b).transport == topo::Transport::kSelf));
      }
    (void)matrix->toText();
    (void)matrix->toJson();
  }
  return 0;
}
