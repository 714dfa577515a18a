// The transport interface: ordered, reliable, tagged byte messages between
// two ranks. A transport knows nothing of collectives; it matches a message
// to a posted receive by tag and hands the rest to the progress engine.
//
// Threading: a Connection may be used from several threads at once (one per
// stream); it serialises internally. Nothing here blocks except where stated.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "src/common/deadline.h"
#include "src/common/status.h"
#include "transports/completion_signal.h"

namespace braid::transport {

// value identifies the message; check describes the call that sent it and
// must equal the receiver's (a different check means the ranks called
// different things). Tag values follow one another per channel (value >>
// 56) on every connection, round a circle (channel_order.h), so a receive
// posted for a value before the latest already arrived in its channel can
// never be matched.
struct Tag {
  uint64_t value = 0;
  uint64_t check = 0;
  uint8_t channel() const { return static_cast<uint8_t>(value >> 56); }
};

// One posted send or receive. The transport completes it; the engine reads.
class Request {
 public:
  enum class State : int { kPending, kDone, kFailed };

  State state() const { return state_.load(std::memory_order_acquire); }
  // Valid once state() == kFailed.
  const Status& error() const { return error_; }
  // Why a receive failed, when the cause was the message itself: another
  // call's message arrived (kDifferentCall; mismatch() is its tag) or the
  // peer sent a later message of the channel first (kOvertaken).
  enum class Failure : int { kOther, kDifferentCall, kOvertaken };
  Failure failure() const { return failure_; }
  const Tag& mismatch() const { return mismatch_; }

  // Either may run on a thread other than the one waiting for the request,
  // which may sleep meanwhile: once it marked the request watched (before
  // its last look at the state), the signal wakes it.
  void complete() {
    state_.store(State::kDone, std::memory_order_seq_cst);
    if (watched_.load(std::memory_order_seq_cst)) CompletionSignal::notify();
  }
  void fail(Status error, Failure failure = Failure::kOther, Tag mismatch = {}) {
    error_ = std::move(error);
    failure_ = failure;
    mismatch_ = mismatch;
    state_.store(State::kFailed, std::memory_order_seq_cst);
    if (watched_.load(std::memory_order_seq_cst)) CompletionSignal::notify();
  }
  // A thread about to sleep until this request ends.
  void watch() { watched_.store(true, std::memory_order_seq_cst); }
  void unwatch() { watched_.store(false, std::memory_order_relaxed); }
  // Some of its bytes moved (sent, arrived or copied), whichever thread
  // moved them: the call that waits for it progresses though it has not
  // ended. Noted by connections whose reportsPartialProgress() is true.
  void noteProgress() { progressMarks_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t progressMarks() const { return progressMarks_.load(std::memory_order_relaxed); }

 private:
  std::atomic<State> state_{State::kPending};
  std::atomic<bool> watched_{false};
  std::atomic<uint64_t> progressMarks_{0};
  Status error_;
  Failure failure_ = Failure::kOther;
  Tag mismatch_;
};
using RequestPtr = std::shared_ptr<Request>;

// How a receive with reduction combines what arrives with local data:
// dst = local (op) incoming, element by element, for `units` elements of
// `unit` bytes. The transport applies it to whole elements as they arrive,
// so the incoming bytes never need a buffer of their own.
struct Combiner {
  size_t unit = 1;
  void (*apply)(void* dst, const void* local, const void* incoming, size_t units,
                const void* context) = nullptr;
  const void* context = nullptr;
  // The same on GPU memory, queued on `stream` (a CUstream) and returning
  // at once: for transports that move GPU memory (cuda_ipc). Null where the
  // build has no device reductions.
  Status (*applyOnDevice)(void* dst, const void* local, const void* incoming, size_t units,
                          const void* context, void* stream) = nullptr;
};

class Connection {
 public:
  virtual ~Connection() = default;

  // Queue a send of `bytes` at `data`; the memory must stay valid and
  // unchanged until the request completes. Never blocks.
  virtual RequestPtr postSend(const void* data, size_t bytes, Tag tag) = 0;
  // Post a receive into `data`; completes when the matching message arrived.
  // A message of another size or check fails it with kInvalidUsage.
  virtual RequestPtr postRecv(void* data, size_t bytes, Tag tag) = 0;
  // A receive whose payload is combined with `local` into `dst` (which may
  // be `local`); both must stay valid until it completes.
  virtual RequestPtr postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                                    const Combiner& combiner) = 0;

  // Moves whatever bytes can move without blocking, in both directions
  // (incoming messages with no posted receive are kept until one is posted).
  // Returns true if anything moved. An error means the connection is dead;
  // every pending request has then failed.
  virtual Result<bool> progress() = 0;
  // True if every request whose bytes it moves notes so (Request::
  // noteProgress) before it ends: then a caller whose thread shares the
  // connection with others can tell the bytes of its own requests from
  // theirs. False: progress() returning true may be anyone's.
  virtual bool reportsPartialProgress() const { return false; }

  // The fd to wait on with poll(2) when progress() moved nothing, and
  // whether output is pending (wait for POLLOUT too); -1 when none.
  virtual int pollFd() const = 0;
  virtual bool wantsWrite() const = 0;
  // Called just before the caller sleeps on pollFd(); false means bytes can
  // move already (or arrived meanwhile), so the caller must not sleep.
  virtual bool prepareToSleep() { return true; }
  // How long the caller may sleep at most before this connection has work
  // that no descriptor announces (a message held for its receive that is
  // due to be copied out, say); the caller sleeps no longer.
  virtual std::chrono::microseconds sleepAtMost() const { return std::chrono::hours(1); }

  // Fails every pending request and closes, telling the peer `reason`
  // (best effort). A reason whose code is kOk is an orderly close: the
  // peer's pending requests fail, but the peer is not told of a failure.
  // Any thread.
  virtual void abort(const Status& reason) = 0;
  // As abort(), and tells the peer which call failed here: `callMark` is
  // the caller's own number for it, opaque to the transport and handed to
  // the peer as peerFailedCall(). A transport that cannot carry it aborts
  // plainly (the peer then sees no mark).
  virtual void abortInCall(const Status& reason, uint64_t callMark) {
    (void)callMark;
    abort(reason);
  }

  // Forgets, of tag's channel, the latest message that arrived when it
  // comes before `tag`. A channel's tags go round a circle (channel_order.h)
  // and a latest arrival more than half of it behind would read as ahead,
  // failing receives as overtaken: the caller, which numbers the calls,
  // asks every so often. Any thread.
  virtual void forgetArrivalsBefore(uint64_t tag) { (void)tag; }

  // True once the connection is dead: the peer left (with or without a
  // goodbye) or it failed here. Nothing more comes on it, and its fd, at
  // end of file, is always readable: a caller that sleeps must not wait on
  // it, or it would spin. Any thread.
  virtual bool ended() const = 0;

  // Non-ok once the peer reported that a call of its failed (its
  // communicator is broken, so is ours).
  virtual Status peerFailure() const = 0;
  // The mark the peer's failure named (abortInCall), once peerFailure() is
  // non-ok; 0 when it named none.
  virtual uint64_t peerFailedCall() const { return 0; }

  // A message that arrived with nobody to receive it, in `channel`, with a
  // tag value below `below`: proof that the peer made a call this rank did
  // not make. Its tag carries the peer's check.
  virtual std::optional<Tag> unclaimed(uint8_t channel, uint64_t below) = 0;

  // False only when surely no message waits, unread or unclaimed: lets a
  // caller skip progress() and unclaimed() on a quiet connection. Any
  // thread, cheap.
  virtual bool mayHaveUnclaimed() const { return true; }

  // The rank at the other end, for messages.
  virtual int peer() const = 0;

  // Makes ahead what posting messages of these sizes (a call's sends to
  // the peer and receives from it, any number, in any order) will use, so
  // that posting them allocates nothing a caller could not allocate then
  // (pinned memory while a CUDA stream waits for the call). Any thread; a
  // no-op where posting allocates nothing of the kind.
  virtual Status reserve(std::span<const size_t> sends, std::span<const size_t> recvs) {
    (void)sends;
    (void)recvs;
    return Status::ok();
  }
};

}  // namespace braid::transport
