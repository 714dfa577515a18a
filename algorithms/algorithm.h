// The registry of algorithms: for each collective, named planners that turn
// CollectiveArgs into this rank's Schedule. Names are the BRAID_ALGO
// spellings. Planners are pure functions: same arguments, same schedule.
#pragma once

#include <span>
#include <string_view>

#include "algorithms/collective.h"
#include "algorithms/schedule.h"

namespace braid::algo {

struct Algorithm {
  CollectiveKind kind;
  std::string_view name;
  Schedule (*plan)(const CollectiveArgs&);
};

std::span<const Algorithm> allAlgorithms();
const Algorithm* findAlgorithm(CollectiveKind kind, std::string_view name);
// The algorithm used when BRAID_ALGO does not name one for this collective.
const Algorithm* defaultAlgorithm(CollectiveKind kind);

// Planners, one per file family.
Schedule planAllReduceRing(const CollectiveArgs& args);
Schedule planReduceScatterRing(const CollectiveArgs& args);
Schedule planAllGatherRing(const CollectiveArgs& args);
Schedule planBroadcastTree(const CollectiveArgs& args);
Schedule planReduceTree(const CollectiveArgs& args);
Schedule planGatherLinear(const CollectiveArgs& args);
Schedule planScatterLinear(const CollectiveArgs& args);
Schedule planAllToAllPairwise(const CollectiveArgs& args);
Schedule planBarrierDissemination(const CollectiveArgs& args);

}  // namespace braid::algo
