// Placeholder: plans with the family's first algorithm until this one lands;
// its estimate is infinite, so the tuner never picks it.
#include <limits>

#include "algorithms/algorithm.h"

namespace braid::algo {

Schedule planBroadcastChain(const CollectiveArgs& args) {
  return planBroadcastTree(args);
}
Cost estimateBroadcastChain(const CollectiveArgs&, const LinkModel&) {
  return {std::numeric_limits<double>::infinity(), 0, 0};
}

Schedule planBroadcastScatterAllGather(const CollectiveArgs& args) {
  return planBroadcastTree(args);
}
Cost estimateBroadcastScatterAllGather(const CollectiveArgs&, const LinkModel&) {
  return {std::numeric_limits<double>::infinity(), 0, 0};
}

}  // namespace braid::algo
