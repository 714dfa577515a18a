// The soak's coordinator: forks the ranks, runs epochs and batches, and judges the results.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <vector>

#include "braid.h"
#include "soak.h"

namespace soak {
namespace {

// ---------------------------------------------------------------------------
// The coordinator.

class Coordinator {
 public:
  explicit Coordinator(const Options& o) : o_(o) {}

  int run() {
    signal(SIGPIPE, SIG_IGN);
    progress_ =
        static_cast<Progress*>(::mmap(nullptr, sizeof(Progress) * o_.ranks, PROT_READ | PROT_WRITE,
                                      MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (progress_ == MAP_FAILED) return fatal("mmap failed");
    for (int r = 0; r < o_.ranks; ++r) new (&progress_[r]) Progress;
    for (int r = 0; r < o_.ranks; ++r) {
      int command[2], reports[2];
      if (::pipe2(command, O_CLOEXEC) != 0 || ::pipe2(reports, O_CLOEXEC) != 0)
        return fatal("pipe failed");
      std::fflush(stdout);
      std::fflush(stderr);
      const pid_t pid = ::fork();
      if (pid < 0) return fatal("fork failed");
      if (pid == 0) {
        ::close(command[1]);
        ::close(reports[0]);
        for (int q = 0; q < r; ++q) {
          ::close(toRank_[q]);
          ::close(fromRank_[q]);
        }
        std::_Exit(runRank(o_, r, command[0], reports[1], &progress_[r]));
      }
      ::close(command[0]);
      ::close(reports[1]);
      pids_.push_back(pid);
      toRank_.push_back(command[1]);
      fromRank_.push_back(reports[0]);
    }
    start_ = Clock::now();
    const int status = coordinate();
    stopRanks(status != 0);
    return status;
  }

 private:
  int fatal(const std::string& why) {
    std::fprintf(stderr, "soak: %s\n", why.c_str());
    return 1;
  }

  bool sendAll(const CommandMessage& m) {
    for (int fd : toRank_)
      if (!writeAll(fd, &m, sizeof m)) return false;
    return true;
  }

  // One report from `rank`, or false (and a message) when it died or hung.
  bool receive(int rank, Report* r, double limitSeconds) {
    pollfd p{fromRank_[rank], POLLIN, 0};
    const auto until = Clock::now() + std::chrono::duration<double>(limitSeconds);
    while (true) {
      const double left = std::chrono::duration<double>(until - Clock::now()).count();
      if (left <= 0) {
        std::fprintf(stderr,
                     "soak: FAIL: rank %d did not report within %.0f s (hung?): epoch %d, call "
                     "#%lld: %s\n",
                     rank, limitSeconds, progress_[rank].epoch.load(),
                     static_cast<long long>(progress_[rank].call.load()), progress_[rank].what);
        return false;
      }
      const int ready = ::poll(&p, 1, static_cast<int>(std::min(left * 1000 + 1, 1000.0)));
      if (ready < 0 && errno != EINTR) return false;
      if (ready > 0) break;
    }
    if (readAll(fromRank_[rank], r, sizeof *r)) return true;
    std::fprintf(stderr, "soak: FAIL: rank %d died (%s) in epoch %d at call #%lld: %s\n", rank,
                 describeExit(rank).c_str(), progress_[rank].epoch.load(),
                 static_cast<long long>(progress_[rank].call.load()), progress_[rank].what);
    return false;
  }

  std::string describeExit(int rank) {
    int status = 0;
    for (int i = 0; i < 50; ++i) {
      if (::waitpid(pids_[rank], &status, WNOHANG) == pids_[rank]) {
        pids_[rank] = -1;
        if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
        return "exit " + std::to_string(WEXITSTATUS(status));
      }
      usleep(20000);
    }
    return "still running";
  }

  // Seconds a batch may take at most: every call at its timeout, plus slack
  // for a loaded machine. Beyond it a rank hangs.
  double batchLimit() const { return 30 + 3 * o_.timeout; }

  int coordinate() {
    int64_t next = 0;
    int epoch = 0, initFailuresInARow = 0;
    bool warm = false;
    while (next < o_.calls) {
      if (secondsSince(start_) > o_.limit)
        return fatal("FAIL: over the time limit of " + std::to_string(o_.limit) + " s");
      const int64_t epochEnd = std::min(o_.calls, next + o_.epochCalls);
      std::string config;
      epochEnvironment(o_, epoch, -1, &config);
      CommandMessage m{};
      m.command = Command::kEpoch;
      m.epoch = epoch;
      m.first = next;
      if (!sendAll(m)) return fatal("a rank went away");
      Report r;
      if (!receive(0, &r, 60)) return 1;
      bool initOk = r.code == braidSuccess;
      if (!initOk)
        std::fprintf(stderr, "soak: epoch %d: braidGetUniqueId failed: %s\n", epoch, r.message);
      CommandMessage id{};
      id.command = Command::kId;
      std::memcpy(id.id, r.id, sizeof id.id);
      for (int q = 1; q < o_.ranks; ++q)
        if (!writeAll(toRank_[q], &id, sizeof id)) return fatal("a rank went away");
      for (int q = 0; q < o_.ranks; ++q) {
        if (!receive(q, &r, 60)) return 1;
        if (r.code != braidSuccess) {
          initOk = false;
          ++initFailures_;
          std::fprintf(stderr, "soak: epoch %d: rank %d: init failed (%d): %s\n", epoch, q, r.code,
                       r.message);
        }
      }
      if (initOk) {
        initFailuresInARow = 0;
        while (next < epochEnd) {
          m.command = Command::kBatch;
          m.first = next;
          m.end = std::min(epochEnd, next + o_.batch);
          if (!sendAll(m)) return fatal("a rank went away");
          int64_t failedAt = -1;
          for (int q = 0; q < o_.ranks; ++q) {
            if (!receive(q, &r, batchLimit())) return 1;
            if (r.failedAt < 0) continue;
            if (failedAt < 0 || r.failedAt < failedAt) failedAt = r.failedAt;
            noteFailure(epoch, q, r);
          }
          if (failedAt >= 0) {
            ++rebuildsAfterFailure_;
            next = failedAt + 1;
            break;
          }
          next = m.end;
        }
      } else if (++initFailuresInARow > 3) {
        return fatal("FAIL: init failed in 4 epochs in a row");
      }
      m.command = Command::kEndEpoch;
      if (!sendAll(m)) return fatal("a rank went away");
      for (int q = 0; q < o_.ranks; ++q) {
        if (!receive(q, &r, 60)) return 1;
        resources_[q].end = r;
        if (!warm) resources_[q].warm = r;
        if (o_.verbose)
          std::printf(
              "soak: epoch %d (%s%s) ends at call %lld: rank %d fds %lld threads %lld "
              "RSS %.1f MiB (anonymous %.1f), heap in use %lld bytes\n",
              epoch, config.c_str(), epochUsesStream(o_, epoch) ? "stream" : "",
              static_cast<long long>(next), q, static_cast<long long>(r.fds),
              static_cast<long long>(r.threads), r.rssKiB / 1024.0, r.anonKiB / 1024.0,
              static_cast<long long>(r.heapBytes));
      }
      // The first communicators warm up allocators and caches.
      if (!warm && next >= o_.calls / 10) {
        warm = true;
        warmCalls_ = next;
      }
      ++epoch;
    }
    epochs_ = epoch;
    return summarize();
  }

  void noteFailure(int epoch, int rank, const Report& r) {
    auto& example = examples_[r.code];
    if (example.empty())
      example = "epoch " + std::to_string(epoch) + ", rank " + std::to_string(rank) + ", call #" +
                std::to_string(r.failedAt) + ": " + r.message;
  }

  int summarize() {
    const double seconds = secondsSince(start_);
    CommandMessage m{};
    m.command = Command::kDone;
    if (!sendAll(m)) return fatal("a rank went away");
    Stats total;
    int failures = 0;
    std::vector<Stats> perRank(o_.ranks);
    for (int q = 0; q < o_.ranks; ++q) {
      Report r;
      if (!receive(q, &r, 60)) return 1;
      if (!readAll(fromRank_[q], &perRank[q], sizeof(Stats))) return fatal("no stats");
      const Stats& s = perRank[q];
      total.calls += s.calls;
      total.successes += s.successes;
      total.wrong += s.wrong;
      total.badFailures += s.badFailures;
      total.skipped += s.skipped;
      total.bytesChecked += s.bytesChecked;
      for (int c = 0; c < 16; ++c) total.failuresByCode[c] += s.failuresByCode[c];
      for (int k = 0; k < static_cast<int>(Kind::kCount); ++k)
        total.callsByKind[k] += s.callsByKind[k];
      total.callSeconds += s.callSeconds;
      total.failedSeconds += s.failedSeconds;
      total.checkSeconds += s.checkSeconds;
      total.initSeconds += s.initSeconds;
      total.destroySeconds += s.destroySeconds;
      total.maxFailedCallSeconds = std::max(total.maxFailedCallSeconds, s.maxFailedCallSeconds);
      if (s.wrong) {
        std::fprintf(stderr, "soak: FAIL: %s (%lld wrong results on rank %d)\n", s.firstWrong,
                     static_cast<long long>(s.wrong), q);
        ++failures;
      }
      if (s.badFailures) {
        std::fprintf(stderr,
                     "soak: FAIL: rank %d: %lld failures with a code no fault explains, no "
                     "message, or past the timeout; the first: %s\n",
                     q, static_cast<long long>(s.badFailures), s.firstBad);
        ++failures;
      }
    }
    const double n = o_.ranks;
    std::printf("soak: %d ranks, seed %llu, faults %s, call timeout %.2f s\n", o_.ranks,
                static_cast<unsigned long long>(o_.seed),
                o_.faults.empty() ? "none" : o_.faults.c_str(), o_.timeout);
    std::printf(
        "soak: %lld collectives (%lld calls on all ranks): %lld succeeded, %lld failed, "
        "%lld skipped after a failure in their batch; %.1f MiB of results checked\n",
        static_cast<long long>(total.calls / o_.ranks), static_cast<long long>(total.calls),
        static_cast<long long>(total.successes),
        static_cast<long long>(total.calls - total.successes),
        static_cast<long long>(total.skipped), total.bytesChecked / 1048576.0);
    std::string kinds;
    for (int k = 0; k < static_cast<int>(Kind::kCount); ++k)
      kinds += std::string(k ? ", " : "") + kKindNames[k] + " " +
               std::to_string(total.callsByKind[k] / o_.ranks);
    std::printf("soak: by kind: %s\n", kinds.c_str());
    std::string codes;
    for (int c = 1; c < 16; ++c)
      if (total.failuresByCode[c])
        codes += std::string(codes.empty() ? "" : ", ") +
                 braidGetErrorString(static_cast<braidResult_t>(c)) + " " +
                 std::to_string(total.failuresByCode[c]);
    std::printf("soak: failed calls by code: %s\n", codes.empty() ? "none" : codes.c_str());
    for (const auto& [code, example] : examples_)
      std::printf("soak:   e.g. (%d) %.300s\n", code, example.c_str());
    std::printf(
        "soak: %d communicators (%d rebuilt after a failure, %d inits failed); "
        "wrong results returned as success: %lld\n",
        epochs_, rebuildsAfterFailure_, initFailures_, static_cast<long long>(total.wrong));
    std::printf(
        "soak: %.1f s; per rank: %.1f s in calls that succeeded, %.1f s in calls that "
        "failed (longest %.2f s), %.1f s checking, %.1f s in init, %.1f s in destroy\n",
        seconds, total.callSeconds / n, total.failedSeconds / n, total.maxFailedCallSeconds,
        total.checkSeconds / n, total.initSeconds / n, total.destroySeconds / n);
    // Resources between communicators: after warm-up and at the end.
    for (int q = 0; q < o_.ranks; ++q) {
      const Report& w = resources_[q].warm;
      const Report& e = resources_[q].end;
      std::printf(
          "soak: rank %d with no communicator, after %lld calls -> at the end: fds %lld "
          "-> %lld, threads %lld -> %lld, RSS %.1f -> %.1f MiB (anonymous %.1f -> %.1f), heap "
          "in use %lld -> %lld bytes%s\n",
          q, static_cast<long long>(warmCalls_), static_cast<long long>(w.fds),
          static_cast<long long>(e.fds), static_cast<long long>(w.threads),
          static_cast<long long>(e.threads), w.rssKiB / 1024.0, e.rssKiB / 1024.0,
          w.anonKiB / 1024.0, e.anonKiB / 1024.0, static_cast<long long>(w.heapBytes),
          static_cast<long long>(e.heapBytes), exactHeap() ? "" : " (inexact)");
      if (e.fds > w.fds || e.threads > w.threads) {
        std::fprintf(stderr, "soak: FAIL: rank %d holds more fds or threads at the end\n", q);
        ++failures;
      }
      // Under a sanitizer its allocator keeps freed memory on purpose, and
      // LeakSanitizer checks for leaks instead (see kDone).
      if (kSanitized) continue;
      // A few bytes of slack: chunk sizes of what the allocator itself keeps.
      if (exactHeap() && e.heapBytes > w.heapBytes + 4096) {
        std::fprintf(stderr, "soak: FAIL: rank %d holds %lld more heap bytes at the end\n", q,
                     static_cast<long long>(e.heapBytes - w.heapBytes));
        ++failures;
      }
      // Slack for the allocator's bookkeeping and page rounding.
      const int64_t slack = 1024;
      if (e.rssKiB > w.rssKiB + slack) {
        std::fprintf(stderr, "soak: FAIL: rank %d's RSS grew by %.1f MiB\n", q,
                     (e.rssKiB - w.rssKiB) / 1024.0);
        ++failures;
      }
    }
    if (total.calls / o_.ranks < o_.calls) {
      std::fprintf(stderr, "soak: FAIL: only %lld collectives ran\n",
                   static_cast<long long>(total.calls / o_.ranks));
      ++failures;
    }
    if (faultRate(o_.faults, "drop") + faultRate(o_.faults, "close") > 0 &&
        total.calls == total.successes) {
      std::fprintf(stderr, "soak: FAIL: drops or cuts were injected but no call failed\n");
      ++failures;
    }
    std::printf("soak: %s\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
  }

  void stopRanks(bool kill) {
    for (int fd : toRank_) ::close(fd);
    for (size_t q = 0; q < pids_.size(); ++q) {
      if (pids_[q] < 0) continue;
      if (kill) ::kill(pids_[q], SIGKILL);
      int status = 0;
      ::waitpid(pids_[q], &status, 0);
      if (!kill && (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
        std::fprintf(stderr, "soak: rank %zu exited abnormally (status %d)\n", q, status);
    }
    for (int fd : fromRank_) ::close(fd);
  }

  const Options& o_;
  Progress* progress_ = nullptr;
  std::vector<pid_t> pids_;
  std::vector<int> toRank_, fromRank_;
  Clock::time_point start_;
  struct Resources {
    Report warm{}, end{};
  };
  std::map<int, Resources> resources_;
  std::map<int, std::string> examples_;
  int64_t warmCalls_ = 0;
  int epochs_ = 0, rebuildsAfterFailure_ = 0, initFailures_ = 0;
};

}  // namespace

int runCoordinator(const Options& o) {
  Coordinator coordinator(o);
  return coordinator.run();
}

}  // namespace soak
