// Fusing a Recv into scratch with the Reduce that consumes it: the pair
// becomes one RecvReduce step (dst = local op incoming, or incoming op local
// where the Reduce had the incoming bytes on its left) and a no-op, so the
// transport combines the payload as it arrives and the scratch slice is
// never written or read again. That removes a write and a read of every
// received byte, which is most of the memory traffic of a large reduction.
//
// A pair is fused only where nothing else can tell the difference:
//   - the Reduce's only dependency is the Recv, or its other one is also a
//     dependency of the Recv (so the fused step starts no later than
//     before, and its local operand is ready when it starts);
//   - the Recv has no other dependent;
//   - no step other than a fused Reduce reads the scratch bytes the Recv
//     would have written.
#pragma once

#include "algorithms/schedule.h"

namespace braid::algo {

// Rewrites `schedule` in place; the steps keep their indices. Returns the
// number of pairs fused.
size_t fuseReceiveReductions(Schedule& schedule);

}  // namespace braid::algo
