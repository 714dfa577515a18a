// The registry of algorithms: for each collective, named planners that turn
// CollectiveArgs into this rank's Schedule, each with its cost estimate.
// Names are the BRAID_ALGO spellings. Planners are pure functions: same
// arguments, same schedule.
#pragma once

#include <span>
#include <string_view>

#include "algorithms/collective.h"
#include "algorithms/cost.h"
#include "algorithms/schedule.h"

namespace braid::algo {

struct Algorithm {
  CollectiveKind kind;
  std::string_view name;
  Schedule (*plan)(const CollectiveArgs&);
  // Predicted cost for the slowest rank (args.rank is ignored).
  Cost (*estimate)(const CollectiveArgs&, const LinkModel&);
};

std::span<const Algorithm> allAlgorithms();
const Algorithm* findAlgorithm(CollectiveKind kind, std::string_view name);
// The algorithm used when BRAID_ALGO does not name one for this collective.
const Algorithm* defaultAlgorithm(CollectiveKind kind);

// Planners and their estimates, one file per algorithm family.
Schedule planAllReduceRing(const CollectiveArgs& args);
Cost estimateAllReduceRing(const CollectiveArgs& args, const LinkModel& link);
Schedule planReduceScatterRing(const CollectiveArgs& args);
Cost estimateReduceScatterRing(const CollectiveArgs& args, const LinkModel& link);
Schedule planAllGatherRing(const CollectiveArgs& args);
Cost estimateAllGatherRing(const CollectiveArgs& args, const LinkModel& link);
Schedule planBroadcastTree(const CollectiveArgs& args);
Cost estimateBroadcastTree(const CollectiveArgs& args, const LinkModel& link);
Schedule planReduceTree(const CollectiveArgs& args);
Cost estimateReduceTree(const CollectiveArgs& args, const LinkModel& link);
Schedule planGatherLinear(const CollectiveArgs& args);
Cost estimateGatherLinear(const CollectiveArgs& args, const LinkModel& link);
Schedule planScatterLinear(const CollectiveArgs& args);
Cost estimateScatterLinear(const CollectiveArgs& args, const LinkModel& link);
Schedule planAllToAllPairwise(const CollectiveArgs& args);
Cost estimateAllToAllPairwise(const CollectiveArgs& args, const LinkModel& link);
Schedule planBarrierDissemination(const CollectiveArgs& args);
Cost estimateBarrierDissemination(const CollectiveArgs& args, const LinkModel& link);

}  // namespace braid::algo
