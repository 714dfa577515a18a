// One job's run through its schedule, for runJobs (src/progress.cc): the
// steps whose predecessors are done are started (transfers posted, local
// steps run, a large one on the CPU in pieces), finished transfers reaped,
// peers' failures read, and what the job waits for described.
#pragma once

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/collective.h"
#include "src/call_signature.h"
#include "src/common/reduce.h"
#include "src/common/strcat.h"
#include "src/progress.h"

namespace braid::detail {

using algo::BufferId;
using algo::Slice;
using algo::Step;
using algo::StepKind;
using transport::Request;
using transport::RequestPtr;

// A local step on the CPU runs in pieces of this many bytes of its output,
// the connections having a turn between two pieces (JobRunner::advance).
constexpr size_t kLocalPieceBytes = 512 << 10;

// The Combiners of a RecvReduce step: the job's datatype and op, the local
// operand first or the incoming one.
inline void combineInto(void* dst, const void* local, const void* incoming, size_t units,
                        const void* context) {
  const Job& job = *static_cast<const Job*>(context);
  reduceElements(dst, local, incoming, units, job.dtype, job.op);
}
inline void combineIncomingFirst(void* dst, const void* local, const void* incoming, size_t units,
                                 const void* context) {
  const Job& job = *static_cast<const Job*>(context);
  reduceElements(dst, incoming, local, units, job.dtype, job.op);
}

// kAverage on a device as a combination whose result is local / nranks.
inline void averageInPlace(void* dst, const void* local, const void*, size_t units,
                           const void* context) {
  const Job& job = *static_cast<const Job*>(context);
  if (dst != local) std::memmove(dst, local, units * dataTypeSize(job.dtype));
  applyAverage(dst, units, job.dtype, job.nranks);
}

struct ActiveRequest {
  int step;
  RequestPtr request;
};

class JobRunner {
 public:
  explicit JobRunner(Job& job) : job_(job), steps_(job.schedule->steps) {
    if (!job.index) derived_ = indexSchedule(*job.schedule);
    index_ = job.index ? job.index : &*derived_;
    waiting_ = index_->waiting;
    ready_ = index_->ready;
    remaining_ = steps_.size();
  }

  bool finished() const { return remaining_ == 0 || !status_.isOk(); }
  const Status& status() const { return status_; }
  Job& job() { return job_; }

  // Runs local steps and posts transfers that are ready. True if anything ran.
  // A large local step on the CPU runs a piece per call: the connections
  // have their turn between pieces, as a peer may be waiting on this rank
  // meanwhile (for room in a ring, an ack, the push of a payload's tail).
  bool advance() {
    bool moved = false;
    while (!ready_.empty() && status_.isOk()) {
      int i = ready_.back();
      ready_.pop_back();
      moved = true;
      start(i);
    }
    if (!inPieces_.empty() && status_.isOk()) {
      moved = true;
      if (runLocalPiece()) {
        finish(inPieces_.front());
        inPieces_.pop_front();
        localDone_ = 0;
      }
    }
    return moved;
  }

  // Collects finished transfers. True if any finished.
  bool reap() {
    bool moved = false;
    for (size_t a = 0; a < active_.size() && status_.isOk();) {
      Request::State state = active_[a].request->state();
      if (state == Request::State::kPending) {
        ++a;
        continue;
      }
      int step = active_[a].step;
      RequestPtr request = std::move(active_[a].request);
      active_[a] = active_.back();
      active_.pop_back();
      if (state == Request::State::kFailed) {
        failWith(describeFailure(step, *request));
        break;
      }
      moved = true;
      finish(step);
    }
    return moved;
  }

  // On before sleeping: a transfer that ends from then on wakes the
  // sleeper (transports/completion_signal.h). Off after the sleep: one this
  // thread completes itself signals no one.
  void watchTransfers(bool on) const {
    for (const auto& a : active_) on ? a.request->watch() : a.request->unwatch();
  }
  // The sum of its transfers' progress marks: it changes when bytes of one
  // of them moved, whichever thread moved them (Request::noteProgress).
  uint64_t transferProgressMarks() const {
    uint64_t sum = 0;
    for (const auto& a : active_) sum += a.request->progressMarks();
    return sum;
  }
  // True if a transfer ended since the last reap(): by another thread that
  // progressed a shared connection, say.
  bool anyTransferEnded() const {
    for (const auto& a : active_)
      if (a.request->state() != Request::State::kPending) return true;
    return false;
  }

  void collectConnections(std::vector<transport::Connection*>* out) const {
    for (const auto& a : active_) out->push_back(job_.connections[steps_[a.step].peer]);
  }

  void failWith(Status s) {
    if (status_.isOk()) status_ = std::move(s);
  }

  // Aborts the connections that still hold requests on this job's memory.
  // A failed call leaves the communicator unusable on this rank: every
  // peer hears why at once (instead of waiting for its own timeout), and no
  // peer can write into memory this call no longer owns.
  // The peers are told which call failed (its tag bound, 0 for a call
  // without one), so that one still in an earlier call can finish it.
  void abandon(const Status& reason) {
    for (transport::Connection* c : job_.connections) c->abortInCall(reason, job_.tagsBelow);
    active_.clear();
  }

  // Fails the job if a peer reported a failure of its own, unless the peer
  // failed in a later call of this job's stream: it had finished this one,
  // so everything it sent for it arrived before its goodbye, and it took
  // what this rank sent it. Failing then would fail a call that needs
  // nothing more from that peer: a rank still running the local steps of
  // its last init step while two others had gone on to fail a mismatched
  // call failed its init.
  void checkPeers() {
    for (transport::Connection* c : job_.connections) {
      Status s = c->peerFailure();
      if (s.isOk() || failedInLaterCall(c->peerFailedCall(), job_.tagsBelow)) continue;
      failWith(Status(s.code(), strCat(job_.callName, " on rank ", job_.rank, ": ", s.message())));
      return;
    }
  }

  // After success: a message nobody claimed means a peer called something else.
  void checkUnclaimed() {
    if (job_.tagsBelow == 0 || !status_.isOk()) return;
    const auto channel = static_cast<uint8_t>(job_.tagsBelow >> 56);
    for (transport::Connection* c : job_.connections) {
      auto stray = c->unclaimed(channel, job_.tagsBelow);
      if (!stray) continue;
      std::string mine = CallSignature::unpack(job_.tagFor(false, c->peer(), 0).check).describe();
      failWith(invalidUsage(strCat("mismatched calls: rank ", job_.rank, " called ", job_.callName,
                                   " ", mine, " but rank ", c->peer(), " sent it a message of ",
                                   CallSignature::unpack(stray->check).describe())));
      return;
    }
  }

  // "step 12 of 40 done; waiting for: receive from rank 3 (4096 bytes, step 13)"
  std::string progressText() const {
    return strCat(steps_.size() - remaining_, " of ", steps_.size(),
                  " steps done; waiting for: ", waitingOn());
  }

  std::string waitingOn() const {
    if (active_.empty()) return "nothing (local work or earlier calls)";
    std::string out;
    for (const auto& a : active_) {
      const Step& s = steps_[a.step];
      if (!out.empty()) out += ", ";
      out += strCat(s.kind == StepKind::kSend ? "send to rank " : "receive from rank ", s.peer,
                    " (", s.kind == StepKind::kSend ? s.src.bytes : s.dst.bytes, " bytes, step ",
                    a.step, ")");
      if (out.size() > 300) return out + ", ...";
    }
    return out;
  }

 private:
  Status describeFailure(int step, const Request& request) const {
    const Step& s = steps_[step];
    const Status& e = request.error();
    if (request.failure() == Request::Failure::kOther)
      return Status(e.code(), strCat(job_.callName, ": ", e.message()));
    transport::Tag mine =
        job_.tagFor(s.kind == StepKind::kSend, s.peer, index_->messageIndex[step]);
    std::string expected = CallSignature::unpack(mine.check).describe();
    if (request.failure() == Request::Failure::kOvertaken)
      return invalidUsage(strCat(job_.callName, " ", expected, " on rank ", job_.rank, ": rank ",
                                 s.peer, " has moved on to a later call without sending ",
                                 "what this call expects; the ranks called different collectives, ",
                                 "counts or roots"));
    std::string theirs = CallSignature::unpack(request.mismatch().check).describe();
    return invalidUsage(strCat("mismatched calls: rank ", job_.rank, " called ", job_.callName, " ",
                               expected, " but rank ", s.peer, " called ", theirs, " (",
                               e.message(), ")"));
  }

  uint8_t* base(BufferId b) const {
    return b == BufferId::kSend ? job_.send : b == BufferId::kRecv ? job_.recv : job_.scratch;
  }
  uint8_t* at(const Slice& s) const {
    uint8_t* p = base(s.buffer);
    return p ? p + s.offset : nullptr;
  }

  void start(int i) {
    const Step& s = steps_[i];
    const size_t es = dataTypeSize(job_.dtype);
    switch (s.kind) {
      case StepKind::kSend:
        postSendInOrder(i);
        return;
      case StepKind::kRecv: {
        transport::Tag tag = job_.tagFor(false, s.peer, index_->messageIndex[i]);
        active_.push_back({i, job_.connections[s.peer]->postRecv(at(s.dst), s.dst.bytes, tag)});
        return;
      }
      case StepKind::kRecvReduce: {
        transport::Tag tag = job_.tagFor(false, s.peer, index_->messageIndex[i]);
        const transport::Combiner combiner{
            es, s.incomingFirst ? &combineIncomingFirst : &combineInto, &job_,
            s.incomingFirst ? job_.gpu.reduceIncomingFirst : job_.gpu.reduce};
        active_.push_back({i, job_.connections[s.peer]->postRecvReduce(
                                  at(s.dst), at(s.src), s.dst.bytes, tag, combiner)});
        return;
      }
      case StepKind::kReduce:
      case StepKind::kCopy:
      case StepKind::kAverage:
        if (job_.gpu.device) {
          if (Status queued = startOnDevice(s); !queued.isOk()) {
            failWith(Status(queued.code(), strCat(job_.callName, ": ", queued.message())));
            return;
          }
          break;
        }
        if (s.dst.bytes > kLocalPieceBytes && divisible(s)) {
          inPieces_.push_back(i);
          return;
        }
        startOnHost(s, 0, s.dst.bytes);
        break;
    }
    finish(i);
  }

  // Whether a local step may run in pieces: its output overlaps neither
  // input, or is one of them exactly (element by element in place).
  bool divisible(const Step& s) const {
    auto apart = [&](const Slice& in) {
      const uint8_t *d = at(s.dst), *x = at(in);
      return d == x || d + s.dst.bytes <= x || x + in.bytes <= d;
    };
    if (s.kind == StepKind::kAverage) return true;
    return apart(s.src) && (s.kind != StepKind::kReduce || apart(s.src2));
  }

  // Runs the next piece of the first step of inPieces_; true once it is done.
  bool runLocalPiece() {
    const Step& s = steps_[inPieces_.front()];
    const size_t es = dataTypeSize(job_.dtype);
    const size_t piece = std::min(s.dst.bytes - localDone_, kLocalPieceBytes / es * es);
    startOnHost(s, localDone_, piece);
    localDone_ += piece;
    return localDone_ == s.dst.bytes;
  }

  // Runs bytes [from, from + bytes) of a local step's output.
  void startOnHost(const Step& s, size_t from, size_t bytes) {
    const size_t es = dataTypeSize(job_.dtype);
    if (bytes == 0) return;
    switch (s.kind) {
      case StepKind::kReduce:
        reduceElements(at(s.dst) + from, at(s.src) + from, at(s.src2) + from, bytes / es,
                       job_.dtype, job_.op);
        break;
      case StepKind::kCopy:
        if (at(s.dst) != at(s.src)) std::memmove(at(s.dst) + from, at(s.src) + from, bytes);
        break;
      case StepKind::kAverage:
        applyAverage(at(s.dst) + from, bytes / es, job_.dtype, job_.nranks);
        break;
      default:
        break;
    }
  }

  // Queues a local step on the job's device, after the work its
  // dependencies queued there.
  Status startOnDevice(const Step& s) {
    const size_t es = dataTypeSize(job_.dtype);
    auto& device = *job_.gpu.device;
    if (s.dst.bytes == 0) return Status::ok();
    switch (s.kind) {
      case StepKind::kReduce:
        return device.enqueueCombine(at(s.dst), at(s.src), at(s.src2), s.dst.bytes,
                                     {es, &combineInto, &job_, job_.gpu.reduce});
      case StepKind::kCopy:
        if (at(s.dst) == at(s.src)) return Status::ok();
        return device.enqueueCopy(at(s.dst), at(s.src), s.dst.bytes);
      case StepKind::kAverage:
        return device.enqueueCombine(at(s.dst), at(s.dst), at(s.dst), s.dst.bytes,
                                     {es, &averageInPlace, &job_, job_.gpu.average});
      default:
        return Status::ok();
    }
  }

  // Sends to one peer are handed to the connection in schedule order, so the
  // peer sees increasing tags (which is how a skipped message is detected).
  // A send that became ready before an earlier one to its peer waits in
  // outOfOrder_ (rare: most schedules make sends ready in order).
  void postSendInOrder(int step) {
    const int peer = steps_[step].peer;
    if (nextSend_.empty()) nextSend_.assign(job_.nranks, 0);
    if (index_->messageIndex[step] != nextSend_[peer]) {
      outOfOrder_.push_back(step);
      return;
    }
    while (step >= 0) {
      const Step& s = steps_[step];
      transport::Tag tag = job_.tagFor(true, peer, nextSend_[peer]);
      active_.push_back({step, job_.connections[peer]->postSend(at(s.src), s.src.bytes, tag)});
      ++nextSend_[peer];
      step = -1;
      for (size_t k = 0; k < outOfOrder_.size(); ++k)
        if (steps_[outOfOrder_[k]].peer == peer &&
            index_->messageIndex[outOfOrder_[k]] == nextSend_[peer]) {
          step = outOfOrder_[k];
          outOfOrder_.erase(outOfOrder_.begin() + static_cast<std::ptrdiff_t>(k));
          break;
        }
    }
  }

  // Dependents become ready last first (they are listed in step order), so
  // that advance(), which takes from the back, starts them in their order:
  // a transport that holds few messages in flight (gpu_staged) is given
  // the earliest pieces, which its peer sends first.
  void finish(int i) {
    --remaining_;
    const auto& begin = index_->dependentsBegin;
    for (int32_t d = begin[i + 1] - 1; d >= begin[i]; --d)
      if (--waiting_[index_->dependents[d]] == 0) ready_.push_back(index_->dependents[d]);
  }

  Job& job_;
  const std::vector<Step>& steps_;
  std::optional<ScheduleIndex> derived_;  // when the job came without one
  const ScheduleIndex* index_ = nullptr;
  std::vector<int32_t> waiting_;
  std::vector<int> ready_;
  std::vector<ActiveRequest> active_;
  std::vector<uint32_t> nextSend_;  // per peer, the index of the next send to post
  std::vector<int> outOfOrder_;     // ready sends waiting for an earlier one
  size_t remaining_ = 0;
  std::deque<int> inPieces_;  // local steps to run in pieces, in the order they became ready
  size_t localDone_ = 0;      // bytes of the first one's output done
  Status status_;
};

}  // namespace braid::detail
