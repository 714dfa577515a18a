// Splitting a schedule's large messages into pieces, each a message of its
// own: where every message crosses a staging copy (GPU memory carried
// through pinned host memory, transports/gpu_staged), a message is copied,
// sent and copied again as a whole, so only separate messages overlap.
// Pieces let the copies of one piece run while the wire carries another,
// whatever the algorithm (butterfly, halving and the linear ones send whole
// blocks).
//
// Every rank of a call must split alike, since a piece is matched by its
// index among the messages of its pair (schedule.h): the rule depends only
// on the sizes, which both ends of a message agree on.
#pragma once

#include <cstddef>

#include "algorithms/schedule.h"

namespace braid::algo {

// `schedule` with each Send, Recv and RecvReduce of more than `pieceBytes`
// (rounded down to whole elements of `elementSize` bytes) replaced, in its
// place, by pieces of that size and a last one of the rest. The steps that
// waited for it wait for all its pieces, through empty copies that join
// them two by two. A schedule with nothing to split comes back unchanged.
Schedule splitTransfers(const Schedule& schedule, size_t pieceBytes, size_t elementSize);

// The size of the pieces splitTransfers cuts: `pieceBytes` rounded down to
// whole elements, at least one.
size_t wholePieceBytes(size_t pieceBytes, size_t elementSize);

}  // namespace braid::algo
