// BRAID_TOPO_FILE: the JSON file of rank descriptions read instead of
// detecting the topology (docs/TOPOLOGY.md), and braid-topo's input. Every
// description accepted must survive the trip to JSON and back, and encode
// into the form exchanged at init that decodes back to it.
#include <cstdint>
#include <string_view>

#include "tests/fuzz/fuzz_common.h"
#include "topology/topology.h"

using braid::fuzz::checkResult;
namespace topo = braid::topo;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto file = topo::parseTopologyJson(text);
  checkResult(file);
  checkResult(topo::rankFromJson(text));
  if (!file.isOk()) return 0;
  FUZZ_CHECK(!file->ranks.empty());
  FUZZ_CHECK(!file->shared || file->ranks.size() == 1);

  const int n = static_cast<int>(file->ranks.size());
  for (int rank : {-1, 0, n - 1, n}) {
    for (int numRanks : {0, n, n + 1}) checkResult(file->entry(rank, numRanks));
  }
  size_t checked = 0;
  for (const topo::RankTopology& r : file->ranks) {
    if (++checked > 16) break;
    auto again = topo::rankFromJson(topo::toJson(r));
    FUZZ_CHECK(again.isOk());
    FUZZ_CHECK(*again == r);
    auto decoded = topo::RankTopology::decode(r.encode());
    FUZZ_CHECK(decoded.isOk());
    if (decoded->devices.size() == r.devices.size() && decoded->cores == r.cores)
      FUZZ_CHECK(*decoded == r);
  }
  return 0;
}
