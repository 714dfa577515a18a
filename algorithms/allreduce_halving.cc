// Placeholder: plans with the family's first algorithm until this one lands;
// its estimate is infinite, so the tuner never picks it.
#include <limits>

#include "algorithms/algorithm.h"

namespace braid::algo {

Schedule planAllReduceHalving(const CollectiveArgs& args) {
  return planAllReduceRing(args);
}
Cost estimateAllReduceHalving(const CollectiveArgs&, const LinkModel&) {
  return {std::numeric_limits<double>::infinity(), 0, 0};
}

}  // namespace braid::algo
