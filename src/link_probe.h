// Measures the cost model's figures at communicator init: alpha and beta by
// a ping-pong between ranks 0 and 1, gamma by a timed reduction on rank 0;
// then rank 0's figures go to every rank, so all choose alike. Figures
// given by BRAID_LINK_ALPHA_US / BRAID_LINK_GBPS / BRAID_REDUCE_GBPS are
// taken as they are, and when all three are given nothing is measured.
#pragma once

#include "algorithms/cost.h"
#include "src/common/status.h"

namespace braid {

class Communicator;

Result<algo::LinkModel> probeLink(Communicator& comm);

}  // namespace braid
