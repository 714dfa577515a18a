#include "src/progress.h"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "algorithms/collective.h"
#include "src/call_tags.h"
#include "src/common/cpu_relax.h"
#include "src/common/log.h"
#include "src/common/reduce.h"
#include "src/common/strcat.h"
#include "src/state_dump.h"

namespace braid {

using algo::BufferId;
using algo::Slice;
using algo::Step;
using algo::StepKind;
using transport::Request;
using transport::RequestPtr;

namespace {

using Clock = std::chrono::steady_clock;

// Stall checks (Job::stallCheck) start after this long without progress, and
// repeat this often: rare enough to cost nothing, soon enough that a
// mismatch fails in a fraction of a second rather than at BRAID_TIMEOUT.
constexpr double kStallCheckSeconds = 0.2;
constexpr auto kStallCheckInterval = std::chrono::milliseconds(200);

// A local step on the CPU runs in pieces of this many bytes of its output,
// the connections having a turn between two pieces (JobRunner::advance).
constexpr size_t kLocalPieceBytes = 512 << 10;

// The Combiners of a RecvReduce step: the job's datatype and op, the local
// operand first or the incoming one.
void combineInto(void* dst, const void* local, const void* incoming, size_t units,
                 const void* context) {
  const Job& job = *static_cast<const Job*>(context);
  reduceElements(dst, local, incoming, units, job.dtype, job.op);
}
void combineIncomingFirst(void* dst, const void* local, const void* incoming, size_t units,
                          const void* context) {
  const Job& job = *static_cast<const Job*>(context);
  reduceElements(dst, incoming, local, units, job.dtype, job.op);
}

// kAverage on a device as a combination whose result is local / nranks.
void averageInPlace(void* dst, const void* local, const void*, size_t units, const void* context) {
  const Job& job = *static_cast<const Job*>(context);
  if (dst != local) std::memmove(dst, local, units * dataTypeSize(job.dtype));
  applyAverage(dst, units, job.dtype, job.nranks);
}

struct ActiveRequest {
  int step;
  RequestPtr request;
};

}  // namespace

ScheduleIndex indexSchedule(const algo::Schedule& schedule) {
  const auto& steps = schedule.steps;
  const size_t n = steps.size();
  ScheduleIndex index;
  index.waiting.assign(n, 0);
  index.messageIndex.assign(n, 0);
  std::vector<int32_t> dependentCount(n + 1, 0);
  std::map<int, uint32_t> sends, recvs;
  for (size_t i = 0; i < n; ++i) {
    const Step& s = steps[i];
    for (auto d : s.after)
      if (d != algo::kNoStep) {
        ++index.waiting[i];
        ++dependentCount[d];
      }
    if (s.kind == StepKind::kSend) index.messageIndex[i] = sends[s.peer]++;
    if (algo::receives(s.kind)) index.messageIndex[i] = recvs[s.peer]++;
    if (index.waiting[i] == 0) index.ready.push_back(static_cast<int>(i));
  }
  index.dependentsBegin.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i)
    index.dependentsBegin[i + 1] = index.dependentsBegin[i] + dependentCount[i];
  index.dependents.assign(index.dependentsBegin[n], 0);
  std::vector<int32_t> fill(index.dependentsBegin.begin(), index.dependentsBegin.end() - 1);
  for (size_t i = 0; i < n; ++i)
    for (auto d : steps[i].after)
      if (d != algo::kNoStep) index.dependents[fill[d]++] = static_cast<int32_t>(i);
  return index;
}

namespace {

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

  void finish(int i) {
    --remaining_;
    const auto& begin = index_->dependentsBegin;
    for (int32_t d = begin[i]; d < begin[i + 1]; ++d)
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

}  // namespace

// A peer that failed closes its connections, so the first error a rank
// sees may come from a survivor that gave up before it (a frame half sent
// leaves no room for its last word). The dead rank's own connection closes
// at about the same time: every connection lost within a short while is
// named, so the culprit is among them.
Status nameLostPeers(const Status& failure,
                     const std::vector<std::unique_ptr<JobRunner>>& runners) {
  std::set<transport::Connection*> all;
  for (auto& r : runners)
    for (transport::Connection* c : r->job().connections) all.insert(c);
  std::set<int> lost;
  const auto start = Clock::now();
  auto lastLoss = start;
  using std::chrono::milliseconds;
  auto check = [&](transport::Connection* c) {
    if (lost.count(c->peer()) || c->progress().isOk()) return;
    lost.insert(c->peer());
    lastLoss = Clock::now();
  };
  std::vector<pollfd> fds;
  std::vector<transport::Connection*> polled;
  while (Clock::now() - lastLoss < milliseconds(50) && Clock::now() - start < milliseconds(300)) {
    for (transport::Connection* c : all) check(c);
    // Sleep as the engine does, announced to each connection first: a
    // shared-memory connection learns of its peer's death from the doorbell
    // socket, which it reads only after a sleep.
    fds.clear();
    polled.clear();
    for (transport::Connection* c : all)
      if (!lost.count(c->peer()) && c->pollFd() >= 0 && c->prepareToSleep()) {
        fds.push_back({c->pollFd(), POLLIN, 0});
        polled.push_back(c);
      }
    if (fds.empty() || ::poll(fds.data(), fds.size(), 1) <= 0) continue;
    for (size_t i = 0; i < polled.size(); ++i)
      if (fds[i].revents != 0) check(polled[i]);
  }
  if (lost.empty()) return failure;
  std::string ranks;
  for (int p : lost) ranks += strCat(ranks.empty() ? "" : ", ", p);
  return Status(failure.code(), strCat(failure.message(), " [connections lost: rank",
                                       lost.size() > 1 ? "s " : " ", ranks, "]"));
}

Status runJobs(std::span<Job> jobs) {
  std::vector<std::unique_ptr<JobRunner>> runners;
  for (Job& job : jobs) runners.push_back(std::make_unique<JobRunner>(job));
  // A job may start once every earlier job with its serial key is finished.
  auto blocked = [&](size_t i) {
    const void* key = runners[i]->job().serialKey;
    if (!key) return false;
    for (size_t j = 0; j < i; ++j)
      if (runners[j]->job().serialKey == key && !runners[j]->finished()) return true;
    return false;
  };
  auto lastMoved = Clock::now();
  auto lastStallCheck = lastMoved;
  std::vector<pollfd> fds;
  std::vector<transport::Connection*> connections;  // with requests of running jobs
  std::set<transport::Connection*> watched;
  std::vector<transport::Connection*> polled;  // polled[i] owns fds[i]
  uint64_t dumpsSeen = stateDumpRequests();
  while (true) {
    bool moved = false, allDone = true;
    if (const uint64_t dumps = stateDumpRequests(); dumps != dumpsSeen) {
      dumpsSeen = dumps;
      for (auto& r : runners)
        if (!r->finished())
          BRAID_INFO("in flight on rank ", r->job().rank, ": ", r->job().callName, ", ",
                     r->progressText());
    }
    for (size_t i = 0; i < runners.size(); ++i) {
      auto& r = runners[i];
      if (r->finished() || blocked(i)) continue;
      const Job& job = r->job();
      if (job.aborted && job.aborted->load(std::memory_order_relaxed))
        r->failWith(invalidUsage(strCat(job.callName, ": communicator aborted")));
      moved |= r->advance();
    }
    connections.clear();
    for (auto& r : runners)
      if (!r->finished()) r->collectConnections(&connections);
    std::sort(connections.begin(), connections.end());
    connections.erase(std::unique(connections.begin(), connections.end()), connections.end());
    for (transport::Connection* c : connections) {
      auto progressed = c->progress();
      // A dead connection has failed its requests; reap() reports them.
      if (progressed.isOk()) moved |= *progressed;
    }
    for (auto& r : runners) {
      if (r->finished()) continue;
      moved |= r->reap();
      if (!r->finished()) r->checkPeers();
      if (r->finished()) r->checkUnclaimed();
      allDone = allDone && r->finished();
    }
    if (allDone) break;
    auto now = Clock::now();
    if (moved) {
      lastMoved = now;
      continue;
    }
    double idle = std::chrono::duration<double>(now - lastMoved).count();
    if (idle >= kStallCheckSeconds && now - lastStallCheck >= kStallCheckInterval) {
      lastStallCheck = now;
      bool failed = false;
      for (auto& r : runners)
        if (!r->finished() && r->job().stallCheck)
          if (Status s = r->job().stallCheck(r->job()); !s.isOk()) {
            r->failWith(std::move(s));
            failed = true;
          }
      if (failed) continue;
    }
    double timeout = 1e30, spin = 0, pureSpin = 0;
    for (auto& r : runners)
      if (!r->finished()) {
        timeout = std::min(timeout, r->job().timeoutSeconds);
        spin = std::max(spin, r->job().spinSeconds);
        pureSpin = std::max(pureSpin, r->job().pureSpinSeconds);
      }
    if (idle < spin) {
      // The first microseconds spin on the CPU alone (a peer on another core
      // answers within them); after that every pass yields, so that a peer
      // waiting for this core (more ranks than cores) can run.
      if (idle < pureSpin)
        cpuRelax();
      else
        sched_yield();
      continue;
    }
    if (idle >= timeout) {
      for (auto& r : runners)
        if (!r->finished())
          r->failWith(timeoutError(strCat(r->job().callName, " on rank ", r->job().rank,
                                          ": no progress for ", timeout, " s (BRAID_TIMEOUT); ",
                                          r->progressText())));
      break;
    }
    // Sleep on every connection of the running calls, not only the busy
    // ones: a peer that gives up says so on a connection we may not be
    // using right now.
    fds.clear();
    watched.clear();
    polled.clear();
    // Not one whose peer failed (a job goes on past a peer that failed a
    // later call): its socket, closed by the peer, would wake every poll.
    for (auto& r : runners)
      if (!r->finished())
        for (transport::Connection* c : r->job().connections)
          if (c->pollFd() >= 0 && c->peerFailure().isOk() && watched.insert(c).second) {
            fds.push_back(
                {c->pollFd(), static_cast<short>(POLLIN | (c->wantsWrite() ? POLLOUT : 0)), 0});
            polled.push_back(c);
          }
    std::set<int> abortFds;
    for (auto& r : runners)
      if (!r->finished() && r->job().abortFd >= 0) abortFds.insert(r->job().abortFd);
    for (int fd : abortFds) fds.push_back({fd, POLLIN, 0});
    int waitMs = static_cast<int>(std::clamp((timeout - idle) * 1000.0 + 1, 1.0, 200.0));
    if (fds.empty()) {
      usleep(1000);
      continue;
    }
    // Shared-memory connections learn here that we sleep, so that their
    // peers ring; bytes that slipped in meanwhile cancel the sleep.
    bool ready = false;
    for (transport::Connection* c : polled) ready = !c->prepareToSleep() || ready;
    if (ready) continue;
    if (::poll(fds.data(), fds.size(), waitMs) <= 0) continue;
    // Idle connections that woke us are read now; busy ones are progressed
    // at the top of the loop anyway.
    for (size_t i = 0; i < polled.size(); ++i)
      if (fds[i].revents != 0 &&
          !std::binary_search(connections.begin(), connections.end(), polled[i]))
        (void)polled[i]->progress();
  }
  Status first;
  // A device job's last steps were only queued, and its combiners point at
  // the job: its device must have run them before the call returns.
  std::set<transport::cuda_ipc::IpcDevice*> devices;
  for (auto& r : runners)
    if (r->job().gpu.device) devices.insert(r->job().gpu.device);
  for (auto* device : devices)
    if (Status ran = device->synchronize(); !ran.isOk()) {
      for (auto& r : runners)
        if (r->job().gpu.device == device)
          r->failWith(Status(ran.code(), strCat(r->job().callName, ": ", ran.message())));
    }
  for (auto& r : runners)
    if (!r->status().isOk()) {
      first = r->status();
      break;
    }
  if (first.code() == ErrorCode::kRemoteError) first = nameLostPeers(first, runners);
  for (auto& r : runners) {
    if (r->status().isOk()) continue;
    r->abandon(reasonForPeers(r->job(), r->status()));
  }
  return first;
}

Status reasonForPeers(const Job& job, const Status& failure) {
  if (job.aborted && job.aborted->load(std::memory_order_relaxed))
    return remoteError(strCat("rank ", job.rank, " aborted the communicator"));
  return failure;
}

}  // namespace braid
