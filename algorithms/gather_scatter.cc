// Placeholder: plans with the family's first algorithm until this one lands;
// its estimate is infinite, so the tuner never picks it.
#include <limits>

#include "algorithms/algorithm.h"

namespace braid::algo {

Schedule planGatherBinomial(const CollectiveArgs& args) {
  return planGatherLinear(args);
}
Cost estimateGatherBinomial(const CollectiveArgs&, const LinkModel&) {
  return {std::numeric_limits<double>::infinity(), 0, 0};
}

Schedule planScatterBinomial(const CollectiveArgs& args) {
  return planScatterLinear(args);
}
Cost estimateScatterBinomial(const CollectiveArgs&, const LinkModel&) {
  return {std::numeric_limits<double>::infinity(), 0, 0};
}

}  // namespace braid::algo
