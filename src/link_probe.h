// Measures the cost model's figures at communicator init. Ranks 0 and 1 run
// small probe schedules through the progress engine: alpha is the extra time
// of a dependent exchange round inside one call, beta comes from a 1 MiB
// exchange, gamma from the extra time of reducing a received 256 KiB (never
// below a local in-cache reduction). Rank 0's figures go to every rank, so
// all choose alike. Figures given by BRAID_LINK_ALPHA_US / BRAID_LINK_GBPS /
// BRAID_REDUCE_GBPS are taken as they are, and when all three are given
// nothing is measured. Nor is anything measured when `parentLink` is given
// (a split of a communicator whose ranks share one host): its figures hold
// for the same links, and only the number of ranks on the host is the
// child's own.
#pragma once

#include <vector>

#include "algorithms/cost.h"
#include "src/common/status.h"

namespace braid {

class Communicator;

Result<algo::LinkModel> probeLink(Communicator& comm, const algo::LinkModel* parentLink = nullptr);

// The median over i of numerators[i] / denominators[i], over as many pairs
// as the shorter holds (the mean of the middle two for an even count); 1
// when there is none.
double medianRatio(const std::vector<double>& numerators, const std::vector<double>& denominators);

}  // namespace braid
