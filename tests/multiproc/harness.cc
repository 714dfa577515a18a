#include "harness.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "../harness/fd_io.h"

namespace braidtest {
namespace {

using Clock = std::chrono::steady_clock;

RankContext* gCurrent = nullptr;

// Records on the result pipe: a tag byte, a 4-byte length, the text.
constexpr char kStepTag = 'S';
constexpr char kFailureTag = 'F';
constexpr char kCountTag = 'C';

using braid::test::readAll;
using braid::test::writeAll;

void writeRecord(int fd, char tag, const std::string& text) {
  if (fd < 0) return;
  std::string rec(1, tag);
  uint32_t len = static_cast<uint32_t>(text.size());
  rec.append(reinterpret_cast<const char*>(&len), 4);
  rec += text;
  writeAll(fd, rec.data(), rec.size());
}

struct Pipe {
  int r = -1, w = -1;
};

Pipe makePipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    std::perror("pipe2");
    std::abort();
  }
  return {fds[0], fds[1]};
}

void closeFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Parses the records a rank sent; keeps a partial record for later.
void parseRecords(std::string& buf, RankOutcome& out) {
  size_t pos = 0;
  while (buf.size() - pos >= 5) {
    uint32_t len;
    std::memcpy(&len, buf.data() + pos + 1, 4);
    if (buf.size() - pos - 5 < len) break;
    char tag = buf[pos];
    std::string text = buf.substr(pos + 5, len);
    if (tag == kStepTag) out.lastStep = text;
    if (tag == kFailureTag) out.failures.push_back(text);
    if (tag == kCountTag) out.failureCount = std::strtoull(text.c_str(), nullptr, 10);
    pos += 5 + len;
  }
  buf.erase(0, pos);
}

}  // namespace

struct RankRunner {
  // Runs in the child; never returns.
  [[noreturn]] static void run(int rank, int nranks, int idFromParent, int idToParent, int resultFd,
                               const std::function<void(RankContext&)>& body,
                               const RunOptions& options) {
    ::signal(SIGPIPE, SIG_DFL);
    if (options.braidTimeoutSeconds > 0)
      ::setenv("BRAID_TIMEOUT", std::to_string(options.braidTimeoutSeconds).c_str(), 1);
    for (const auto& [name, value] : options.env) ::setenv(name.c_str(), value.c_str(), 1);
    RankContext ctx;
    ctx.rank = rank;
    ctx.nranks = nranks;
    ctx.resultFd_ = resultFd;
    gCurrent = &ctx;
    try {
      ctx.step("braidGetUniqueId / receiving the unique id");
      unsigned char ok = 0;
      if (rank == 0) {
        braidResult_t r = options.createId ? braidGetUniqueId(&ctx.id) : braidSuccess;
        ok = r == braidSuccess;
        if (!ok) ctx.fail(__FILE__, __LINE__, describeResult(r, "braidGetUniqueId(&id)"));
        writeAll(idToParent, &ok, 1);
        if (ok) writeAll(idToParent, &ctx.id, sizeof ctx.id);
      } else {
        if (!readAll(idFromParent, &ok, 1) ||
            (ok && !readAll(idFromParent, &ctx.id, sizeof ctx.id)))
          ok = 0;
        if (!ok) ctx.fail(__FILE__, __LINE__, "no unique id: rank 0 failed to create one");
      }
      if (ok && options.createId && options.initComm) {
        ctx.step("braidCommInitRank");
        braidResult_t r = braidCommInitRank(&ctx.comm, nranks, ctx.id, rank);
        if (r != braidSuccess) {
          ctx.fail(__FILE__, __LINE__,
                   describeResult(r, "braidCommInitRank(&comm, nranks, id, rank)"));
          ok = 0;
        }
      }
      if (ok) {
        try {
          body(ctx);
        } catch (const RankAbort&) {
        }
        if (ctx.comm) {
          ctx.step("braidCommDestroy");
          braidResult_t r = braidCommDestroy(ctx.comm);
          if (r != braidSuccess)
            ctx.fail(__FILE__, __LINE__, describeResult(r, "braidCommDestroy(comm)"));
        }
      }
    } catch (const std::exception& e) {
      ctx.fail(__FILE__, __LINE__, std::string("uncaught exception: ") + e.what());
    } catch (...) {
      ctx.fail(__FILE__, __LINE__, "uncaught exception");
    }
    ctx.step("exiting");
    writeRecord(resultFd, kCountTag, std::to_string(ctx.failures_));
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(ctx.failures_ == 0 ? 0 : 1);
  }
};

void RankContext::step(const std::string& what) {
  writeRecord(resultFd_, kStepTag, what);
}

void RankContext::fail(const char* file, int line, const std::string& message) {
  if (failures_++ >= kMaxFailures) return;
  const char* base = std::strrchr(file, '/');
  std::string text =
      std::string(base ? base + 1 : file) + ":" + std::to_string(line) + ": " + message;
  writeRecord(resultFd_, kFailureTag, text);
}

RankContext& currentRank() {
  if (!gCurrent) {
    std::fprintf(stderr, "RANK_* macro used outside runRanks()\n");
    std::abort();
  }
  return *gCurrent;
}

bool mentions(std::string text, std::string word) {
  for (auto* s : {&text, &word})
    for (char& c : *s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text.find(word) != std::string::npos;
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string describeResult(braidResult_t r, const std::string& call) {
  return call + " returned " + braidGetErrorString(r) + " (" + std::to_string(r) +
         "): " + braidGetLastError(nullptr);
}

bool MultiProcessResult::ok() const {
  for (const auto& r : ranks)
    if (!r.exited || r.exitCode != 0 || r.failureCount > 0) return false;
  return true;
}

MultiProcessResult runRanks(int nranks, std::function<void(RankContext&)> body,
                            std::chrono::seconds timeout, const RunOptions& options) {
  MultiProcessResult result;
  auto start = Clock::now();
  auto deadline = start + timeout;
  std::fflush(stdout);
  std::fflush(stderr);
  struct sigaction ignore {
  }, oldPipe{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &oldPipe);

  Pipe idUp = makePipe();
  std::vector<Pipe> idDown(nranks), results(nranks);
  for (int r = 0; r < nranks; ++r) {
    idDown[r] = makePipe();
    results[r] = makePipe();
  }
  std::vector<pid_t> pids(nranks, -1);
  for (int r = 0; r < nranks; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) {
      ADD_FAILURE() << "fork failed: " << std::strerror(errno);
      nranks = r;
      break;
    }
    if (pid == 0) {
      // Close every harness descriptor this rank does not use (they are
      // close-on-exec only), so that EOF on a pipe means its rank is gone.
      for (int k = 0; k < static_cast<int>(idDown.size()); ++k) {
        if (k != r) closeFd(idDown[k].r);
        closeFd(idDown[k].w);
        closeFd(results[k].r);
        if (k != r) closeFd(results[k].w);
      }
      closeFd(idUp.r);
      if (r != 0) closeFd(idUp.w);
      RankRunner::run(r, nranks, idDown[r].r, idUp.w, results[r].w, body, options);
    }
    pids[r] = pid;
  }
  closeFd(idUp.w);
  for (auto& p : idDown) closeFd(p.r);
  for (auto& p : results) closeFd(p.w);

  result.ranks.resize(nranks);
  for (int r = 0; r < nranks; ++r) result.ranks[r].rank = r;

  // Relay the unique id from rank 0 to the others.
  unsigned char ok = 0;
  braidUniqueId id{};
  {
    pollfd p{idUp.r, POLLIN, 0};
    int waitMs = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (nranks > 0 && ::poll(&p, 1, waitMs > 0 ? waitMs : 0) == 1 && readAll(idUp.r, &ok, 1) && ok)
      ok = readAll(idUp.r, &id, sizeof id) ? 1 : 0;
    closeFd(idUp.r);
    for (int r = 1; r < nranks; ++r) {
      writeAll(idDown[r].w, &ok, 1);
      if (ok) writeAll(idDown[r].w, &id, sizeof id);
      closeFd(idDown[r].w);
    }
    closeFd(idDown[0].w);
  }

  // Collect records and exit statuses until every rank is gone.
  std::vector<std::string> pending(nranks);
  std::vector<bool> reaped(nranks, false);
  int live = nranks, openPipes = nranks;
  bool killed = false, cutShort = false;
  while (live > 0 || openPipes > 0) {
    std::vector<pollfd> fds;
    std::vector<int> owner;
    for (int r = 0; r < nranks; ++r)
      if (results[r].r >= 0) {
        fds.push_back({results[r].r, POLLIN, 0});
        owner.push_back(r);
      }
    if (!fds.empty())
      ::poll(fds.data(), fds.size(), 50);
    else
      ::usleep(20000);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      int r = owner[i];
      char buf[65536];
      ssize_t n = ::read(results[r].r, buf, sizeof buf);
      if (n > 0) {
        pending[r].append(buf, static_cast<size_t>(n));
        parseRecords(pending[r], result.ranks[r]);
      } else if (n == 0 || errno != EINTR) {
        closeFd(results[r].r);
        --openPipes;
      }
    }
    for (int r = 0; r < nranks; ++r) {
      if (reaped[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      reaped[r] = true;
      --live;
      RankOutcome& o = result.ranks[r];
      if (WIFEXITED(status)) {
        o.exited = true;
        o.exitCode = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        o.signal = WTERMSIG(status);
      }
      bool failed = !o.exited || o.exitCode != 0;
      auto grace = Clock::now() + options.graceAfterFailure;
      if (failed && !killed && grace < deadline) {
        deadline = grace;
        cutShort = true;
      }
    }
    if (!killed && Clock::now() > deadline && live > 0) {
      killed = true;
      for (int r = 0; r < nranks; ++r)
        if (!reaped[r]) {
          result.ranks[r].timedOut = true;
          ::kill(pids[r], SIGKILL);
        }
    }
  }
  ::sigaction(SIGPIPE, &oldPipe, nullptr);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();

  for (const RankOutcome& o : result.ranks) {
    std::string where = "rank " + std::to_string(o.rank) + " of " + std::to_string(nranks);
    std::string last = o.lastStep.empty() ? "" : " (last step: " + o.lastStep + ")";
    for (const auto& f : o.failures) ADD_FAILURE() << where << ": " << f;
    if (o.failureCount > o.failures.size())
      ADD_FAILURE() << where << ": " << o.failureCount - o.failures.size() << " more failures";
    if (o.timedOut && cutShort)
      ADD_FAILURE() << where << " still running " << options.graceAfterFailure.count()
                    << " s after another rank failed; killed" << last;
    else if (o.timedOut)
      ADD_FAILURE() << where << " killed after the timeout of " << timeout.count() << " s" << last;
    else if (!o.exited)
      ADD_FAILURE() << where << " crashed with signal " << o.signal << " (" << ::strsignal(o.signal)
                    << ")" << last;
    else if (o.exitCode != 0 && o.failures.empty())
      ADD_FAILURE() << where << " exited with code " << o.exitCode << last;
  }
  return result;
}

}  // namespace braidtest
