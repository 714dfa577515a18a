// How the communicator numbers its calls' messages in transport tags: the
// top byte is the channel (2 * stream, +1 for point to point), and the
// collectives of a stream take one range of tags per call, in the order of
// the calls. The call number is 32 bits and wraps after 2^32 calls (hours
// of small calls): tags compare in the channel's circular order
// (transports/channel_order.h). The engine, the shared-memory board and the
// communicator read them alike.
#pragma once

#include <cstdint>

#include "transports/channel_order.h"

namespace braid {

// A collective call's messages to one peer: at most this many.
inline constexpr uint64_t kMessagesPerCall = uint64_t{1} << 24;

inline uint64_t channelBits(int stream, bool pointToPoint) {
  return static_cast<uint64_t>(2 * stream + (pointToPoint ? 1 : 0)) << 56;
}

// The first tag of collective call `sequence` on `stream`. Each call's
// kMessagesPerCall numbers start 1 past a multiple of kMessagesPerCall, so
// that no call's bound below is 0 (no call); the 2^32 calls take every
// number of the channel, and the call after number 2^32 - 1 follows it
// round the circle.
inline uint64_t collectiveTagBase(int stream, uint32_t sequence) {
  return channelBits(stream, false) | ((uint64_t{sequence} << 24) + 1);
}

// Message k of the call whose first tag is `base`: the numbers wrap within
// the channel.
inline uint64_t collectiveTag(uint64_t base, uint64_t k) {
  constexpr uint64_t kNumbers = transport::kChannelTagNumbers - 1;
  return (base & ~kNumbers) | ((base + k) & kNumbers);
}

// Every tag of the call comes before this, every tag of a later call on
// the stream is this or after it. A rank that fails a call tells its peers this
// bound (Connection::abortInCall).
inline uint64_t collectiveTagBound(int stream, uint32_t sequence) {
  return collectiveTag(collectiveTagBase(stream, sequence), kMessagesPerCall);
}

// Every this many calls of a stream, its connections forget latest
// arrivals before the call (Connection::forgetArrivalsBefore), so that none
// is left more than twice this behind: far less than the half circle
// (2^31 calls) past which it would read as ahead.
inline constexpr uint32_t kForgetArrivalsEvery = uint32_t{1} << 28;
inline bool forgetsArrivalsAt(uint32_t sequence) {
  return (sequence & (kForgetArrivalsEvery - 1)) == 0;
}

// Whether a peer's failure in the call bounded by `failedBound` came after
// the call bounded by `bound`: the same stream, a later call. Such a peer
// had finished this call, so everything it sent for it has arrived and it
// took what it was sent. 0 is no call.
inline bool failedInLaterCall(uint64_t failedBound, uint64_t bound) {
  return bound != 0 && failedBound != 0 &&
         transport::channelOf(failedBound) == transport::channelOf(bound) &&
         transport::tagBefore(bound, failedBound);
}

}  // namespace braid
