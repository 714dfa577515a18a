// Fault injection, for testing how braid fails: a Connection that wraps any
// other and, with probabilities drawn from a seeded generator, drops a
// message (or delivers only its first bytes), holds it back, or cuts the
// connection in the middle of it
// (BRAID_FAULTS; docs/ENVIRONMENT.md). Like every transport it knows nothing
// of collectives: a message is bytes and a tag.
//
// Why two levels. Drop and delay act on whole messages, so they live on the
// Connection: a byte stream has no message boundaries, and dropping bytes
// from the middle of a TCP or shared-memory stream (which never happens:
// both are reliable until they end) would only garble the framing. A cut is
// the opposite: a process that dies leaves its last frame cut at whatever
// byte it had reached and says no goodbye, which only a ByteStream under the
// framing layer (StreamConnection) can reproduce; a Connection could only
// close in order. So the Connection decides, per message, and the stream
// below it (FaultyStream) carries out the cut. Over a connection with no
// FaultyStream under it, a cut is an orderly close.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "src/common/env.h"
#include "transports/byte_stream.h"
#include "transports/tcp/socket.h"
#include "transports/transport.h"

namespace braid::transport::faulty {

// What happens to one message.
struct Fault {
  // kTruncate: a drop that delivers only the first bytes of the message.
  enum class Kind { kNone, kDrop, kTruncate, kDelay, kCut };
  Kind kind = Kind::kNone;
  std::chrono::microseconds delay{0};  // kDelay: how long it is held back
  size_t keep = 0;                     // kTruncate: bytes delivered, fewer than sent
  size_t cutAfter = 0;                 // kCut: stream bytes written before the cut
};

// The seeded draw of a fault per message. Its own generator (splitmix64),
// not <random>'s distributions, whose results differ between standard
// libraries: a seed names the same faults everywhere.
class FaultDice {
 public:
  // `stream` tells connections apart (both ends of every pair of ranks
  // draw differently under one seed).
  FaultDice(const FaultSpec& spec, uint64_t stream);
  // The fault of the next message of `bytes` bytes. A cut comes after at
  // most `bytes` more bytes of the stream: inside the message's frame or
  // before it (a message that crosses as a descriptor puts less than its
  // size in the stream; its cut may fall in a later frame).
  Fault next(size_t bytes);

 private:
  uint64_t bits();
  double uniform();  // [0, 1)

  FaultSpec spec_;
  uint64_t state_;
};

// A ByteStream that can be cut: after cutAfter(n), once n more bytes are
// written, the stream below is closed with no last word, as the kernel
// closes a dead process's socket, and every later call fails. The peer reads
// those n bytes, then the end of the stream.
class FaultyStream final : public ByteStream {
 public:
  FaultyStream(std::unique_ptr<ByteStream> inner, int peer);

  // Not thread-safe by itself: FaultyConnection calls it, and everything
  // that reaches this stream, under its one lock.
  void cutAfter(size_t bytes);

  Result<size_t> writeSome(const iovec* iov, int count) override;
  Result<size_t> readSome(void* into, size_t room) override;
  void writeLast(const iovec* iov, int count) override;
  void close() override { inner_->close(); }
  int pollFd() const override { return inner_->pollFd(); }
  bool pollForWrite(bool sendsPending) const override { return inner_->pollForWrite(sendsPending); }
  bool prepareToSleep(bool sendsPending) override;
  bool canReadPeer() const override { return inner_->canReadPeer(); }
  std::optional<uint64_t> peerReadKey(const void* data, size_t bytes) override {
    return inner_->peerReadKey(data, bytes);
  }
  Status readPeer(void* into, uint64_t address, uint64_t key, size_t bytes) override;

 private:
  Status cutStatus() const;
  void cutNow();

  std::unique_ptr<ByteStream> inner_;
  const int peer_;
  bool armed_ = false;
  size_t left_ = 0;  // bytes still written before the cut, while armed_
  bool cut_ = false;
};

class FaultyConnection final : public Connection {
 public:
  // `stream` is the FaultyStream under `inner` (owned by it), or null.
  // `rank` is this end's rank: with the peer it picks the dice's stream.
  FaultyConnection(std::unique_ptr<Connection> inner, FaultyStream* stream, const FaultSpec& spec,
                   int rank);
  ~FaultyConnection() override;

  RequestPtr postSend(const void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecv(void* data, size_t bytes, Tag tag) override {
    return inner_->postRecv(data, bytes, tag);
  }
  RequestPtr postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                            const Combiner& combiner) override {
    return inner_->postRecvReduce(dst, local, bytes, tag, combiner);
  }
  Result<bool> progress() override;
  // While messages are held back, the caller sleeps on a timer that expires
  // when the first is due, not on the connection: whatever arrives
  // meanwhile waits at most as long as the hold.
  int pollFd() const override;
  bool wantsWrite() const override;
  bool prepareToSleep() override;
  std::chrono::microseconds sleepAtMost() const override { return inner_->sleepAtMost(); }
  void abort(const Status& reason) override;
  void abortInCall(const Status& reason, uint64_t callMark) override;
  Status peerFailure() const override { return inner_->peerFailure(); }
  // Not while messages are held: their timer is what the caller waits on.
  bool ended() const override;
  uint64_t peerFailedCall() const override { return inner_->peerFailedCall(); }
  bool mayHaveUnclaimed() const override { return inner_->mayHaveUnclaimed(); }
  void forgetArrivalsBefore(uint64_t tag) override { inner_->forgetArrivalsBefore(tag); }
  std::optional<Tag> unclaimed(uint8_t channel, uint64_t below) override {
    return inner_->unclaimed(channel, below);
  }
  int peer() const override { return inner_->peer(); }

  // Faults drawn so far, for tests and logs.
  struct Counts {
    uint64_t messages = 0, dropped = 0, truncated = 0, delayed = 0, cut = 0;
  };
  Counts counts() const;

 private:
  using Clock = std::chrono::steady_clock;
  // A message held back, and every later one (the connection keeps order).
  struct Held {
    const void* data;
    size_t bytes;
    Tag tag;
    RequestPtr request;  // the caller's
    Clock::time_point due;
  };
  // A released message: the caller's request follows the inner one.
  struct Relay {
    RequestPtr outer, inner;
  };

  // Hands due messages to the inner connection; true if any.
  bool releaseDue(Clock::time_point now);
  // Copies the inner requests' outcomes to the callers'.
  void settleRelays();
  void armTimer();
  void cut(size_t afterBytes);

  const std::unique_ptr<Connection> inner_;
  FaultyStream* const stream_;
  mutable std::mutex mutex_;
  FaultDice dice_;
  std::deque<Held> held_;
  std::vector<Relay> relays_;
  tcp::Fd timer_;  // timerfd, made at the first delay
  Counts counts_;
};

// Wraps `stream` in a FaultyStream when `spec` injects anything; returns the
// FaultyStream (owned by `stream`), or null.
FaultyStream* wrapStream(std::unique_ptr<ByteStream>& stream, const FaultSpec& spec, int peer);
// Wraps `connection` in a FaultyConnection when `spec` injects anything.
void wrapConnection(std::unique_ptr<Connection>& connection, FaultyStream* stream,
                    const FaultSpec& spec, int rank);

}  // namespace braid::transport::faulty
