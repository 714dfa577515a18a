// The control frames of a StreamConnection, shared by its stream path
// (stream_connection.cc) and its descriptor path (stream_descriptors.cc).
#pragma once

#include <cstdint>

namespace braid::transport {

// A tag's channel: its top byte.
inline uint64_t channelBase(uint64_t tag) {
  return tag & (uint64_t{0xff} << 56);
}

// Channel 0xff carries the connection's own frames, never a message.
// A goodbye is the last frame on a connection: its check is the ErrorCode
// of why the sender ended it and its payload the message, so the peer can
// report the cause instead of a bare "connection closed"; its key names
// the call that failed there (Connection::abortInCall; 0: none).
inline constexpr uint64_t kControlChannel = uint64_t{0xff} << 56;
inline constexpr uint64_t kGoodbyeTag = kControlChannel;
// An ack tells the sender of a descriptor that its payload was copied (or
// will never be): check = the descriptor's tag, remote = its address.
inline constexpr uint64_t kAckTag = kControlChannel | 1;
// A push asks the sender of a descriptor to copy the payload's tail into the
// receiver's memory itself while the receiver copies the head: check = the
// descriptor's tag, bytes = the head's length (where the tail starts),
// remote = the receiver's address of the payload's start, key = what the
// receiver's stream gave for reaching that memory (peerReadKey).
inline constexpr uint64_t kPushTag = kControlChannel | 2;
// The sender's answer to a push, once it wrote all it will: check = the
// descriptor's tag, remote = its address, bytes = how much of the tail it
// wrote, from the tail's start (0: none; the receiver copies the rest).
inline constexpr uint64_t kPushedTag = kControlChannel | 3;

}  // namespace braid::transport
