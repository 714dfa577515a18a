// Placeholder: plans with the family's first algorithm until this one lands;
// its estimate is infinite, so the tuner never picks it.
#include <limits>

#include "algorithms/algorithm.h"

namespace braid::algo {

Schedule planAllGatherDoubling(const CollectiveArgs& args) {
  return planAllGatherRing(args);
}
Cost estimateAllGatherDoubling(const CollectiveArgs&, const LinkModel&) {
  return {std::numeric_limits<double>::infinity(), 0, 0};
}

Schedule planAllGatherBruck(const CollectiveArgs& args) {
  return planAllGatherRing(args);
}
Cost estimateAllGatherBruck(const CollectiveArgs&, const LinkModel&) {
  return {std::numeric_limits<double>::infinity(), 0, 0};
}

}  // namespace braid::algo
