#include "src/progress.h"

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>

#include "algorithms/collective.h"
#include "src/call_tags.h"
#include "src/common/cpu_relax.h"
#include "src/common/log.h"
#include "src/common/strcat.h"
#include "src/job_runner.h"
#include "src/state_dump.h"
#include "transports/completion_signal.h"

namespace braid {

using algo::Step;
using algo::StepKind;
using detail::JobRunner;

namespace {

using Clock = std::chrono::steady_clock;

// Stall checks (Job::stallCheck) start after this long without progress, and
// repeat this often: rare enough to cost nothing, soon enough that a
// mismatch fails in a fraction of a second rather than at BRAID_TIMEOUT.
constexpr double kStallCheckSeconds = 0.2;
constexpr auto kStallCheckInterval = std::chrono::milliseconds(200);

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
  // The runner takes ready steps from the back: the first steps start
  // first, so a transport that holds few messages in flight (gpu_staged)
  // is given the earliest ones, which its peer sends first.
  std::reverse(index.ready.begin(), index.ready.end());
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
  // Bytes moved on a connection the jobs use, and bytes moved for the jobs
  // themselves: the threads of several streams share the connections, and
  // what one stream's calls move is no progress of a call stuck on another.
  auto lastMoved = Clock::now();
  auto lastOwnMoved = lastMoved;
  auto lastStallCheck = lastMoved;
  uint64_t progressMarksSeen = 0;
  std::vector<pollfd> fds;
  std::vector<transport::Connection*> connections;  // with requests of running jobs
  std::set<transport::Connection*> watched;
  std::vector<transport::Connection*> polled;  // polled[i] owns fds[i]
  uint64_t dumpsSeen = stateDumpRequests();
  while (true) {
    bool moved = false, ownMoved = false, allDone = true;
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
      ownMoved |= r->advance();
      // Ended on a local step: the reap below passes it by.
      if (r->finished()) r->checkUnclaimed();
    }
    connections.clear();
    for (auto& r : runners)
      if (!r->finished()) r->collectConnections(&connections);
    std::sort(connections.begin(), connections.end());
    connections.erase(std::unique(connections.begin(), connections.end()), connections.end());
    for (transport::Connection* c : connections) {
      auto progressed = c->progress();
      // A dead connection has failed its requests; reap() reports them.
      if (progressed.isOk() && *progressed) {
        moved = true;
        ownMoved |= !c->reportsPartialProgress();
      }
    }
    for (auto& r : runners) {
      if (r->finished()) continue;
      ownMoved |= r->reap();
      if (!r->finished()) r->checkPeers();
      if (r->finished()) r->checkUnclaimed();
      allDone = allDone && r->finished();
    }
    if (allDone) break;
    auto now = Clock::now();
    if (ownMoved) {
      lastOwnMoved = lastMoved = now;
      continue;
    }
    // Bytes of the jobs' transfers that moved, whichever thread moved them
    // (this one, or another that shares a connection while this one slept),
    // reset the timeout's clock only: this thread has nothing to do for them.
    // (A pass after one that reaped sees a sum of other transfers: one
    // spurious reset, right after a real one.)
    uint64_t marks = 0;
    for (auto& r : runners)
      if (!r->finished()) marks += r->transferProgressMarks();
    if (marks != progressMarksSeen) lastOwnMoved = now;
    progressMarksSeen = marks;
    if (moved) lastMoved = now;
    const double idle = std::chrono::duration<double>(now - lastMoved).count();
    const double stuck = std::chrono::duration<double>(now - lastOwnMoved).count();
    if (stuck >= kStallCheckSeconds && now - lastStallCheck >= kStallCheckInterval) {
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
    if (stuck >= timeout) {
      for (auto& r : runners)
        if (!r->finished())
          r->failWith(timeoutError(strCat(r->job().callName, " on rank ", r->job().rank,
                                          ": no progress for ", timeout, " s (BRAID_TIMEOUT); ",
                                          r->progressText())));
      break;
    }
    if (moved) continue;  // others' bytes: the connections are busy
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
    // Sleep on every connection of the running calls, not only the busy
    // ones: a peer that gives up says so on a connection we may not be
    // using right now.
    fds.clear();
    watched.clear();
    polled.clear();
    // Not one that ended (a job goes on past a peer that failed a later
    // call, closed its communicator or vanished, where it needs nothing
    // more from it): its socket, at end of file, would wake every poll.
    for (auto& r : runners)
      if (!r->finished())
        for (transport::Connection* c : r->job().connections)
          if (c->pollFd() >= 0 && c->peerFailure().isOk() && !c->ended() &&
              watched.insert(c).second) {
            fds.push_back(
                {c->pollFd(), static_cast<short>(POLLIN | (c->wantsWrite() ? POLLOUT : 0)), 0});
            polled.push_back(c);
          }
    std::set<int> abortFds;
    for (auto& r : runners)
      if (!r->finished() && r->job().abortFd >= 0) abortFds.insert(r->job().abortFd);
    for (int fd : abortFds) fds.push_back({fd, POLLIN, 0});
    double sleepMs = std::clamp((timeout - stuck) * 1000.0 + 1, 1.0, 200.0);
    for (transport::Connection* c : polled)
      sleepMs = std::min(sleepMs, 1.0 + static_cast<double>(c->sleepAtMost().count()) / 1000.0);
    const int waitMs = static_cast<int>(sleepMs);
    if (fds.empty()) {
      usleep(1000);
      continue;
    }
    // Shared-memory connections learn here that we sleep, so that their
    // peers ring; bytes that slipped in meanwhile cancel the sleep.
    bool ready = false;
    for (transport::Connection* c : polled) ready = !c->prepareToSleep() || ready;
    if (ready) continue;
    // Another thread on a shared connection may have completed a request
    // of ours since the reap, or may do so while we sleep (the signal).
    auto watch = [&](bool on) {
      for (auto& r : runners)
        if (!r->finished()) r->watchTransfers(on);
    };
    watch(true);
    transport::CompletionSignal::beginSleep();
    bool ended = false;
    for (auto& r : runners) ended = ended || (!r->finished() && r->anyTransferEnded());
    if (ended) {
      transport::CompletionSignal::endSleep();
      watch(false);
      continue;
    }
    if (const int signal = transport::CompletionSignal::fd(); signal >= 0)
      fds.push_back({signal, POLLIN, 0});
    const int woken = ::poll(fds.data(), fds.size(), waitMs);
    transport::CompletionSignal::endSleep();
    watch(false);
    if (woken <= 0) continue;
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
