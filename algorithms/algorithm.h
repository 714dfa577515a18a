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

// One rank's AllReduce: the result is its own input (a copy unless in place).
Schedule planOwnInput(const CollectiveArgs& args);

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

// Added by the algorithm family (one file per family).
Schedule planAllReduceButterfly(const CollectiveArgs& args);
Cost estimateAllReduceButterfly(const CollectiveArgs& args, const LinkModel& link);
Schedule planAllReduceHalving(const CollectiveArgs& args);
Cost estimateAllReduceHalving(const CollectiveArgs& args, const LinkModel& link);
Schedule planAllReduceDbtree(const CollectiveArgs& args);
Cost estimateAllReduceDbtree(const CollectiveArgs& args, const LinkModel& link);
Schedule planBroadcastChain(const CollectiveArgs& args);
Cost estimateBroadcastChain(const CollectiveArgs& args, const LinkModel& link);
Schedule planBroadcastScatterAllGather(const CollectiveArgs& args);
Cost estimateBroadcastScatterAllGather(const CollectiveArgs& args, const LinkModel& link);
Schedule planReduceScatterGather(const CollectiveArgs& args);
Cost estimateReduceScatterGather(const CollectiveArgs& args, const LinkModel& link);
Schedule planAllGatherDoubling(const CollectiveArgs& args);
Cost estimateAllGatherDoubling(const CollectiveArgs& args, const LinkModel& link);
Schedule planAllGatherBruck(const CollectiveArgs& args);
Cost estimateAllGatherBruck(const CollectiveArgs& args, const LinkModel& link);
Schedule planReduceScatterHalving(const CollectiveArgs& args);
Cost estimateReduceScatterHalving(const CollectiveArgs& args, const LinkModel& link);
Schedule planAllToAllBruck(const CollectiveArgs& args);
Cost estimateAllToAllBruck(const CollectiveArgs& args, const LinkModel& link);
Schedule planGatherBinomial(const CollectiveArgs& args);
Cost estimateGatherBinomial(const CollectiveArgs& args, const LinkModel& link);
Schedule planScatterBinomial(const CollectiveArgs& args);
Cost estimateScatterBinomial(const CollectiveArgs& args, const LinkModel& link);

}  // namespace braid::algo
