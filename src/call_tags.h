// How the communicator numbers its calls' messages in transport tags: the
// top byte is the channel (2 * stream, +1 for point to point), and the
// collectives of a stream take one rising range of tags per call. The
// engine, the shared-memory board and the communicator read them alike.
#pragma once

#include <cstdint>

namespace braid {

// A collective call's messages to one peer: at most this many.
inline constexpr uint64_t kMessagesPerCall = uint64_t{1} << 24;

inline uint64_t channelBits(int stream, bool pointToPoint) {
  return static_cast<uint64_t>(2 * stream + (pointToPoint ? 1 : 0)) << 56;
}

// The first tag of collective call `sequence` on `stream`.
inline uint64_t collectiveTagBase(int stream, uint32_t sequence) {
  return channelBits(stream, false) | (uint64_t{sequence} << 24);
}

// Every tag of the call is below this, every tag of a later call on the
// stream at or above it. A rank that fails a call tells its peers this
// bound (Connection::abortInCall).
inline uint64_t collectiveTagBound(int stream, uint32_t sequence) {
  return collectiveTagBase(stream, sequence) + kMessagesPerCall;
}

// Whether a peer's failure in the call bounded by `failedBound` came after
// the call bounded by `bound`: the same stream, a later call. Such a peer
// had finished this call, so everything it sent for it has arrived and it
// took what it was sent. 0 is no call.
inline bool failedInLaterCall(uint64_t failedBound, uint64_t bound) {
  return bound != 0 && failedBound > bound && (failedBound >> 56) == (bound >> 56);
}

}  // namespace braid
