// A Connection over one ByteStream (a TCP socket, shared-memory rings).
// Frames are {tag, check, bytes, remote} followed by the payload. Large
// payloads move between the stream and the caller's memory directly; small
// ones go through a staging buffer so that one read can carry many frames.
//
// Over a stream that can read the peer's memory (ByteStream::readPeer), a
// large send is a descriptor instead: a frame whose `remote` is the payload's
// address in the sender and which carries no payload. Once a receive matches
// it, the receiver copies the payload with readPeer() straight into place
// (or combines it piece by piece through the staging buffer), then answers
// with an ack frame; the send completes on the ack, the receive once the ack
// is written. A descriptor waits, uncopied, for its receive to be posted,
// unless the rank holding it goes idle (see Options): then it is copied into
// this rank's memory and acknowledged at once, so that ranks that each send
// before they receive still complete, as they would through the stream.
#pragma once

#include <sys/uio.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "transports/byte_stream.h"
#include "transports/channel_order.h"
#include "transports/transport.h"

namespace braid::transport {

class StreamConnection final : public Connection {
 public:
  struct Options {
    // Sends of at least this many bytes go as descriptors when the stream
    // can read the peer's memory; 0: never.
    size_t readPeerBytes = 64 << 10;
    // A descriptor left unclaimed this long is copied into this rank's
    // memory and acknowledged, as if its payload had come through the
    // stream: a sender is never held for good by a receive that comes late
    // or never (ranks that send to each other before receiving, mismatched
    // calls). Checked on progress() and before sleeping; two ends about to
    // sleep while each holds the other's descriptor copy at once.
    std::chrono::microseconds unclaimedDescriptorWait{20000};
    // A descriptor of at least this many bytes matched to a plain receive
    // is copied by both ends at once where the stream can write the peer's
    // memory: the receiver copies the head while the sender, asked by a
    // push frame, writes the tail into the receive buffer. A sender that
    // only waits for its ack (a Broadcast's root, a Send) then lends its
    // core to the copy; 0: the receiver copies everything.
    size_t pushBytes = 512 << 10;
  };

  // The wire header of every frame, in host byte order; public for the
  // tests that play a peer byte by byte.
  struct FrameHeader {
    uint64_t tag;
    uint64_t check;
    uint64_t bytes;
    // 0: the payload follows. Else a descriptor: the payload stays at this
    // address in the sender's memory until the receiver acknowledges it.
    uint64_t remote;
    uint64_t key;  // a descriptor's: what the sender's stream gave for reading it (peerReadKey)
  };

  StreamConnection(std::unique_ptr<ByteStream> stream, int peer);
  StreamConnection(std::unique_ptr<ByteStream> stream, int peer, Options options);
  ~StreamConnection() override;

  RequestPtr postSend(const void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecv(void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                            const Combiner& combiner) override;
  Result<bool> progress() override;
  bool reportsPartialProgress() const override { return true; }
  int pollFd() const override { return stream_->pollFd(); }
  bool wantsWrite() const override {
    return stream_->pollForWrite(sendsPending_.load(std::memory_order_relaxed));
  }
  bool prepareToSleep() override;
  // Until the oldest large message held for its receive is due to be
  // copied out (Options::unclaimedDescriptorWait), whose sender waits.
  std::chrono::microseconds sleepAtMost() const override;
  void abort(const Status& reason) override;
  void abortInCall(const Status& reason, uint64_t callMark) override;
  int peer() const override { return peer_; }
  Status peerFailure() const override;
  bool ended() const override;
  uint64_t peerFailedCall() const override;
  std::optional<Tag> unclaimed(uint8_t channel, uint64_t below) override;
  void forgetArrivalsBefore(uint64_t tag) override;
  bool mayHaveUnclaimed() const override {
    return unexpectedCount_.load(std::memory_order_relaxed) > 0 || stream_->mayHaveInput();
  }

 private:
  struct PendingSend {
    FrameHeader header;
    const uint8_t* data;
    size_t sent;         // of the header and whatever payload follows it
    RequestPtr request;  // of an ack: the receive it completes, if any
  };
  struct PostedRecv {
    uint8_t* data;
    size_t bytes;
    uint64_t check;
    RequestPtr request;
    const uint8_t* local = nullptr;  // receives with reduction only
    Combiner combiner;
    uint64_t remote = 0;  // matched to a descriptor: where its payload is
    uint64_t remoteKey = 0;
    size_t copied = 0;  // of that payload, so far
    // A push: the sender writes [split, bytes) unless it answers otherwise.
    bool asked = false;           // decided whether to ask for one
    size_t split = 0;             // 0: no push asked, or its answer taken
    bool awaitingPushed = false;  // asked, not yet answered
    size_t pushed = 0;            // of the tail, by the answer
    bool reduces() const { return combiner.apply != nullptr; }
  };
  // A payload this end holds: one that came with no receive posted, or one
  // copied out of the peer's memory. It grows with the bytes that arrive,
  // never ahead of them to the size a header claims, which a corrupt or
  // hostile peer may set to anything. Uninitialised bytes: a payload is
  // written whole before it is read, and zeroing it first would only fault
  // its pages in twice.
  struct Payload {
    struct Free {
      void operator()(uint8_t* p) const { std::free(p); }
    };
    std::unique_ptr<uint8_t, Free> bytes;
    size_t capacity = 0;
    // Room for `n` bytes in all; false when memory ran out.
    bool reserve(size_t n);
    uint8_t* data() { return bytes.get(); }
  };
  // A push this end was asked for: the tail of one of its descriptors.
  struct Push {
    uint64_t tag;  // the descriptor's
    uint64_t remote;
    const uint8_t* from;
    uint64_t to;     // in the peer's memory
    uint64_t toKey;  // the key the peer gave for it
    size_t bytes;
    size_t done = 0;
    RequestPtr request;  // the send whose payload it writes
  };
  struct Unexpected {
    uint64_t check;
    uint64_t bytes;
    Payload payload;      // empty while remote != 0
    uint64_t remote = 0;  // a descriptor: the payload is still the peer's
    std::chrono::steady_clock::time_point arrived{};
    uint64_t remoteKey = 0;
  };

  // Copies out descriptors left unclaimed for `unclaimedWait` or longer.
  Result<bool> progressLocked(std::chrono::microseconds unclaimedWait);
  Result<bool> sendSome();
  Result<bool> recvSome();
  // Copies the next pieces of matched descriptors' payloads.
  Result<bool> pullSome();
  void headerArrived();
  void startFrame();
  void finishFrame();
  void descriptorArrived();
  void ackArrived();
  void queueAck(uint64_t tag, uint64_t remote, RequestPtr request);
  // Queues a frame of this connection's own ahead of every frame not yet begun.
  void queueControl(const FrameHeader& header, RequestPtr request);
  // Asks the senders of newly matched large descriptors for pushes; true
  // when it queued any.
  bool askForPushes();
  void pushRequested();
  void pushAnswered();
  // Writes the next pieces of the pushes asked of this end.
  Result<bool> pushSome();
  // Matches `posted` to the frame whose payload is arriving unmatched.
  void adopt(PostedRecv& posted);
  // Room in spill_ for the incoming frame's first `n` payload bytes; false
  // (and the connection closed) when memory ran out.
  bool spillRoom(size_t n);
  // Copies an unclaimed descriptor's payload into `u` and acknowledges it.
  Status copyOut(uint64_t tag, Unexpected& u);
  Status copyOutUnclaimed(std::chrono::microseconds olderThan);
  bool holdsUnclaimed(std::chrono::microseconds olderThan) const;
  // Puts a whole payload where the receive wants it.
  static void deliver(const PostedRecv& p, const uint8_t* payload);
  // Combines the next `n` payload bytes of the matched receive with reduction.
  void combineArriving(const uint8_t* in, size_t n);
  void failPostedBefore(uint64_t tag, const Tag& arrived);
  // Finishes the incoming frame; true when it answered a receive and now
  // nothing of this end waits on the connection (no receive posted, no send
  // or copy unfinished, no bytes read and not yet parsed). The read stops
  // there, and what the peer sent next stays in the stream: the caller, its
  // call done, posts the next receives first, and the payload goes straight
  // where they want it. Read on, it came in unmatched and was copied a
  // second time (in one launch of 16 MiB Send/Recv over TCP, 6 messages of
  // 23 on one rank).
  bool finishFrameAndStop();
  void failAll(const Status& reason);
  // Says goodbye (best effort), naming `callMark` (0: none), closes the
  // stream and fails everything.
  void closeWith(const Status& reason, uint64_t callMark = 0);
  Status deadStatus() const;

  std::unique_ptr<ByteStream> stream_;
  const int peer_;
  const Options options_;
  mutable std::mutex mutex_;
  std::atomic<bool> sendsPending_{false};
  Status dead_;  // set once the connection failed or was aborted
  std::atomic<bool> peerFailed_{false};
  Status peerFailure_;           // written once, before peerFailed_
  uint64_t peerFailedCall_ = 0;  // the goodbye's call mark, likewise

  std::deque<PendingSend> sends_;
  std::deque<PendingSend> awaitingAck_;  // descriptors written, payload not yet copied
  std::map<uint64_t, PostedRecv> posted_;
  std::map<uint64_t, Unexpected> unexpected_;
  std::atomic<size_t> unexpectedCount_{0};  // unexpected_.size(), read without the lock
  size_t unexpectedDescriptors_ = 0;
  // posted_ keys matched to descriptors, in arrival order, but for those
  // whose head is copied while the sender has not answered its push.
  std::deque<uint64_t> pulls_;
  std::deque<Push> pushes_;
  bool pushRefused_ = false;  // a write into the peer failed: pushes are declined
  // Payloads copied out of the peer's memory since the stream last proved
  // the peer had not given up (a failed send frees its buffer): unexpected_
  // keys dropped if the connection dies first.
  std::vector<uint64_t> unconfirmed_;
  LatestArrivals latestArrived_;

  // Incoming frame being read.
  FrameHeader header_{};
  size_t headerGot_ = 0;
  bool inPayload_ = false;
  uint8_t* target_ = nullptr;  // where the payload goes (posted, or spill_'s data)
  size_t payloadGot_ = 0;
  PostedRecv* matched_ = nullptr;
  Payload spill_;                      // payload with no posted receive yet
  alignas(16) uint8_t carry_[16];      // an element split between two reads
  alignas(64) uint8_t aligned_[4096];  // misaligned incoming elements, copied

  std::vector<uint8_t> staging_;
  size_t stagingBegin_ = 0, stagingEnd_ = 0;
};

}  // namespace braid::transport
