// braidrun: starts N local ranks of a command, wired for braidCommInitFromEnv.
//
//   braidrun -n N [--port P] [--bind core|none] [--] CMD ARGS...
//
// Every rank gets braidrun's environment plus BRAID_RANK, BRAID_WORLD_SIZE,
// BRAID_ADDR (127.0.0.1:PORT) and a fresh BRAID_SECRET shared by all ranks.
// Rank output is relayed line by line with a "[r] " prefix. The first rank
// that fails brings the others down, and braidrun exits with its status.
//
// Rank r is bound to the r-th CPU braidrun may run on (round robin when
// ranks outnumber them), as mpirun binds to cores. Unbound, ranks started
// together often share one CPU until the scheduler moves one away: on a
// 2-CPU host, the link probe at init then timed 8 us rounds in half the
// launches, against 0.6 us bound, and moved the tuner's choices with it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace {

constexpr int kUsageExitCode = 2;
constexpr int kExecFailedExitCode = 127;  // the shell's "command cannot be run"
constexpr auto kTerminateGrace = std::chrono::seconds(3);
constexpr const char* kUsage =
    "usage: braidrun -n N [--port P] [--] CMD [ARGS...]\n"
    "  -n, --np N    number of ranks to start (>= 1)\n"
    "  --port P      port of rank 0 on 127.0.0.1 (default: a free port)\n"
    "  --bind B      core: rank r runs on the r-th CPU braidrun may use, round robin\n"
    "                (default); none: ranks may run on any of them\n";

// Owns a file descriptor; closing on scope exit keeps every error path leak-free.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    std::swap(fd_, other.fd_);
    return *this;
  }
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool isOpen() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

struct Pipe {
  Fd readEnd;
  Fd writeEnd;
};

// O_CLOEXEC so that no rank inherits another rank's pipes (or the self-pipe).
Pipe makePipe(int readFlags) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    std::perror("braidrun: pipe");
    std::exit(1);
  }
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | readFlags);
  return {Fd(fds[0]), Fd(fds[1])};
}

[[noreturn]] void usageError(const std::string& message) {
  std::fprintf(stderr, "braidrun: %s\n%s", message.c_str(), kUsage);
  std::exit(kUsageExitCode);
}

// The limit on open files braidrun was started with, which its ranks get back.
rlimit startingFileLimit{};

// braidrun holds the read ends of two pipes per rank (and four ends while
// it makes them), besides a few of its own: it raises its soft limit on
// open files as far as the hard one allows, and refuses a number of ranks
// that still does not fit, before it starts any.
void makeRoomForFilesOf(int numRanks) {
  const rlim_t needed = 2 * static_cast<rlim_t>(numRanks) + 32;
  if (::getrlimit(RLIMIT_NOFILE, &startingFileLimit) != 0) return;
  if (startingFileLimit.rlim_cur != RLIM_INFINITY && startingFileLimit.rlim_cur < needed) {
    rlimit raised = startingFileLimit;
    raised.rlim_cur = startingFileLimit.rlim_max == RLIM_INFINITY
                          ? needed
                          : std::min(needed, startingFileLimit.rlim_max);
    (void)::setrlimit(RLIMIT_NOFILE, &raised);
  }
  rlimit now{};
  if (::getrlimit(RLIMIT_NOFILE, &now) == 0 && now.rlim_cur != RLIM_INFINITY &&
      now.rlim_cur < needed)
    usageError(std::to_string(numRanks) + " ranks need " + std::to_string(needed) +
               " open files, over this process's limit of " + std::to_string(now.rlim_cur) +
               " (raise it with ulimit -n)");
}

struct Options {
  int numRanks = 0;
  int port = 0;  // 0: pick a free one
  bool bindToCores = true;
  std::vector<std::string> command;
};

int parsePositiveInt(const std::string& text, const char* what, int max) {
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < 1 || value > max) {
    usageError(std::string("invalid ") + what + " '" + text + "' (expected 1.." +
               std::to_string(max) + ")");
  }
  return static_cast<int>(value);
}

Options parseOptions(int argc, char** argv) {
  Options options;
  bool haveNumRanks = false;
  int i = 1;
  // Options end at the first non-option word, so the command's own flags
  // (e.g. "-n 20" of a perf driver) are never taken for braidrun's.
  while (i < argc) {
    std::string arg = argv[i];
    auto value = [&](const std::string& name) -> std::string {
      if (arg.size() > name.size() && arg.compare(0, name.size() + 1, name + "=") == 0) {
        return arg.substr(name.size() + 1);
      }
      if (i + 1 >= argc) usageError("option " + name + " needs a value");
      return argv[++i];
    };
    if (arg == "--") {
      ++i;
      break;
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (arg == "-n" || arg == "--np" || arg.starts_with("--np=")) {
      options.numRanks = parsePositiveInt(value(arg.starts_with("--np") ? "--np" : "-n"),
                                          "number of ranks", 1 << 16);
      haveNumRanks = true;
    } else if (arg == "--port" || arg.starts_with("--port=")) {
      options.port = parsePositiveInt(value("--port"), "port", 65535);
    } else if (arg == "--bind" || arg.starts_with("--bind=")) {
      const std::string how = value("--bind");
      if (how != "core" && how != "none")
        usageError("invalid binding '" + how + "' (expected core or none)");
      options.bindToCores = how == "core";
    } else if (arg.starts_with("-")) {
      usageError("unknown option '" + arg + "'");
    } else {
      break;
    }
    ++i;
  }
  if (!haveNumRanks) usageError("missing -n N");
  for (; i < argc; ++i) options.command.emplace_back(argv[i]);
  if (options.command.empty()) usageError("no command given");
  return options;
}

// Resolves CMD as execvp would, so that a typo is a usage error reported once,
// not N identical rank failures.
std::optional<std::string> findExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    return ::access(name.c_str(), F_OK) == 0 ? std::optional(name) : std::nullopt;
  }
  const char* pathEnv = std::getenv("PATH");
  std::istringstream searchPath(pathEnv != nullptr ? pathEnv : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(searchPath, dir, ':');) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    struct stat info;
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return std::nullopt;
}

// Binding port 0 lets the kernel choose; the port may in principle be taken
// again before rank 0 listens on it, which is why --port exists.
int findFreePort() {
  Fd sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (!sock.isOpen() || ::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("braidrun: cannot find a free port");
    std::exit(1);
  }
  return ntohs(addr.sin_port);
}

std::string makeSecret() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    std::fputs("braidrun: RAND_bytes failed\n", stderr);
    std::exit(1);
  }
  std::string hex;
  for (unsigned char byte : bytes) {
    hex += "0123456789abcdef"[byte >> 4];
    hex += "0123456789abcdef"[byte & 15];
  }
  return hex;
}

// Forwarded to the ranks (all but SIGCHLD): those that end a job (an ssh
// session that drops sends SIGHUP) and Slurm's warnings before its time
// limit (`--signal=USR1@N`), which would otherwise end braidrun alone.
constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD};

// A forwarded signal that ends the job: ranks still running after the grace
// period are killed, and the run never reports success.
bool endsTheJob(int signo) {
  return signo == SIGINT || signo == SIGTERM || signo == SIGHUP || signo == SIGQUIT;
}

sigset_t handledSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int signo : kHandledSignals) sigaddset(&set, signo);
  return set;
}

void setSignalMask(int how) {
  sigset_t set = handledSignals();
  ::sigprocmask(how, &set, nullptr);
}

void writeAll(int fd, std::string_view text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    // A stdout that another process made nonblocking: wait for room, as
    // a blocking one would, rather than drop the ranks' lines.
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd room{fd, POLLOUT, 0};
      (void)::poll(&room, 1, 1000);
      continue;
    }
    if (n <= 0) return;  // our own stdout is gone; nothing sensible left to do
    done += static_cast<size_t>(n);
  }
}

// One of a rank's output pipes, relayed to braidrun's fd of the same number.
struct OutputRelay {
  Fd source;
  int destination;
  std::string prefix;  // "[rank] "
  std::string partialLine;
};

struct Rank {
  int index = 0;
  pid_t pid = -1;
  bool running = false;
  OutputRelay relays[2];  // stdout, stderr
};

// Relays the complete lines readable now (one read, so that a chatty rank
// cannot starve the others), and at end of file the unterminated last line.
// Once the rank has exited, everything it wrote is in the pipe: drain it all
// and close, dropping whatever a leftover child of the rank may write later
// rather than waiting for it.
void relayOutput(OutputRelay& relay, bool rankExited) {
  std::string lines;
  char buffer[65536];
  bool atEnd = false;
  while (!atEnd) {
    ssize_t n = ::read(relay.source.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      atEnd = rankExited || n == 0 || errno != EAGAIN;
      break;
    }
    relay.partialLine.append(buffer, static_cast<size_t>(n));
    size_t lineStart = 0;
    for (size_t newline; (newline = relay.partialLine.find('\n', lineStart)) != std::string::npos;
         lineStart = newline + 1) {
      lines += relay.prefix;
      lines.append(relay.partialLine, lineStart, newline + 1 - lineStart);
    }
    relay.partialLine.erase(0, lineStart);
    if (!rankExited) break;
  }
  if (atEnd) {
    if (!relay.partialLine.empty()) lines += relay.prefix + relay.partialLine + "\n";
    relay.partialLine.clear();
    relay.source.reset();
  }
  writeAll(relay.destination, lines);
}

// Each rank leads its own process group so that a signal also reaches the
// processes it started (e.g. the command under "sh -c").
void signalRunningRanks(const std::vector<Rank>& ranks, int signo) {
  for (const Rank& rank : ranks) {
    if (rank.running && ::kill(-rank.pid, signo) != 0) ::kill(rank.pid, signo);
  }
}

// The CPU set of each rank: one CPU of braidrun's own set, round robin;
// empty when not binding or when that set cannot be read.
std::vector<cpu_set_t> rankCpuSets(int numRanks, bool bind) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (!bind || ::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return {};
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  if (cpus.empty()) return {};
  std::vector<cpu_set_t> sets(static_cast<size_t>(numRanks));
  for (int index = 0; index < numRanks; ++index) {
    CPU_ZERO(&sets[index]);
    CPU_SET(cpus[static_cast<size_t>(index) % cpus.size()], &sets[index]);
  }
  return sets;
}

// Runs in the forked child; it neither allocates nor touches stdio, as those
// are not safe between fork and exec.
[[noreturn]] void execRank(int index, pid_t launcherPid, const std::string& path, char* const* argv,
                           char* const* envp, const cpu_set_t* cpus, Pipe& out, Pipe& err) {
  ::setpgid(0, 0);
  // A rank that cannot be bound still runs, only unbound.
  if (cpus != nullptr) (void)::sched_setaffinity(0, sizeof(*cpus), cpus);
  // If braidrun dies without a chance to clean up (killed outright), its
  // ranks must not linger, those that ignore SIGTERM included.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcherPid) ::_exit(kExecFailedExitCode);  // it died before prctl
  ::signal(SIGPIPE, SIG_DFL);  // ignored by braidrun, and an ignored signal stays so past exec
  if (startingFileLimit.rlim_max != 0) (void)::setrlimit(RLIMIT_NOFILE, &startingFileLimit);
  setSignalMask(SIG_UNBLOCK);
  // A rank in its own process group would be stopped by reading a terminal, so
  // only rank 0 gets stdin, and only when it is not a terminal.
  if (index != 0 || ::isatty(STDIN_FILENO)) {
    int devNull = ::open("/dev/null", O_RDONLY);
    if (devNull >= 0) ::dup2(devNull, STDIN_FILENO);
  }
  ::dup2(out.writeEnd.get(), STDOUT_FILENO);
  ::dup2(err.writeEnd.get(), STDERR_FILENO);
  ::execve(path.c_str(), argv, envp);
  const char* reason = std::strerror(errno);
  for (std::string_view piece : {"braidrun: cannot execute '", path.c_str(), "': ", reason, "\n"}) {
    writeAll(STDERR_FILENO, piece);
  }
  ::_exit(kExecFailedExitCode);
}

std::string describeFailure(const Rank& rank, int status) {
  std::string what =
      "braidrun: rank " + std::to_string(rank.index) + " (pid " + std::to_string(rank.pid) + ")";
  if (WIFSIGNALED(status)) {
    int signo = WTERMSIG(status);
    return what + " was killed by signal " + std::to_string(signo) + " (" + strsignal(signo) +
           ")\n";
  }
  return what + " exited with status " + std::to_string(WEXITSTATUS(status)) + "\n";
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parseOptions(argc, argv);
  std::optional<std::string> executable = findExecutable(options.command[0]);
  if (!executable) usageError("command not found: '" + options.command[0] + "'");
  makeRoomForFilesOf(options.numRanks);

  const int port = options.port != 0 ? options.port : findFreePort();
  const std::string secret = makeSecret();

  // Built before forking, since the child must not allocate.
  std::vector<std::string> baseEnv;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string_view var = *entry;
    bool ours = var.starts_with("BRAID_RANK=") || var.starts_with("BRAID_WORLD_SIZE=") ||
                var.starts_with("BRAID_ADDR=") || var.starts_with("BRAID_SECRET=");
    if (!ours) baseEnv.emplace_back(var);
  }
  baseEnv.push_back("BRAID_WORLD_SIZE=" + std::to_string(options.numRanks));
  baseEnv.push_back("BRAID_ADDR=127.0.0.1:" + std::to_string(port));
  baseEnv.push_back("BRAID_SECRET=" + secret);
  std::vector<char*> commandArgv;
  for (std::string& word : options.command) commandArgv.push_back(word.data());
  commandArgv.push_back(nullptr);

  // Signals are blocked for good and read from a signalfd, with no handler:
  // a handler runs only when the process's runtime lets it, and one that a
  // sanitizer runtime deferred was sometimes never run, leaving braidrun in
  // poll() for ranks long gone. Blocked, a signal waits in the kernel.
  // Their default actions too, for the ranks to inherit, and since SIGCHLD
  // ignored by whatever started braidrun would have the kernel reap the
  // ranks itself, their exits unseen.
  for (int signo : kHandledSignals) ::signal(signo, SIG_DFL);
  setSignalMask(SIG_BLOCK);
  const sigset_t signalsToRead = handledSignals();
  Fd signalReader(::signalfd(-1, &signalsToRead, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signalReader.isOpen()) {
    std::perror("braidrun: signalfd");
    return 1;
  }
  // A reader of braidrun's output that goes (`braidrun ... | head`) must not
  // end braidrun, and with it the ranks' teardown: writeAll gives up instead.
  ::signal(SIGPIPE, SIG_IGN);

  const pid_t launcherPid = ::getpid();
  std::vector<Rank> ranks(static_cast<size_t>(options.numRanks));
  const std::vector<cpu_set_t> cpuSets = rankCpuSets(options.numRanks, options.bindToCores);
  for (int index = 0; index < options.numRanks; ++index) {
    std::vector<std::string> rankEnv = baseEnv;
    rankEnv.push_back("BRAID_RANK=" + std::to_string(index));
    std::vector<char*> envp;
    for (std::string& var : rankEnv) envp.push_back(var.data());
    envp.push_back(nullptr);
    Pipe out = makePipe(O_NONBLOCK);
    Pipe err = makePipe(O_NONBLOCK);

    pid_t pid = ::fork();
    if (pid == 0)
      execRank(index, launcherPid, *executable, commandArgv.data(), envp.data(),
               cpuSets.empty() ? nullptr : &cpuSets[static_cast<size_t>(index)], out, err);
    if (pid < 0) {
      std::perror("braidrun: fork");
      signalRunningRanks(ranks, SIGKILL);
      return 1;
    }
    ::setpgid(pid, pid);  // also here, so that signals reach a child that has not run yet
    Rank& rank = ranks[static_cast<size_t>(index)];
    rank.index = index;
    rank.pid = pid;
    rank.running = true;
    std::string prefix = std::string("[") + std::to_string(index) + "] ";
    rank.relays[0] = {std::move(out.readEnd), STDOUT_FILENO, prefix, {}};
    rank.relays[1] = {std::move(err.readEnd), STDERR_FILENO, prefix, {}};
  }

  using Clock = std::chrono::steady_clock;
  int runningRanks = options.numRanks;
  int exitCode = 0;
  std::optional<Clock::time_point> killDeadline;  // set once ranks are being torn down
  // Set by a SIGTERM or SIGINT forwarded to the ranks: those still running
  // at it are killed, as at a teardown, but their ends are still reported.
  std::optional<Clock::time_point> forwardedDeadline;
  bool killSent = false;
  int endedBySignal = 0;  // the first forwarded signal that ends the job
  auto deadline = [&]() -> std::optional<Clock::time_point> {
    if (killDeadline && forwardedDeadline) return std::min(*killDeadline, *forwardedDeadline);
    return killDeadline ? killDeadline : forwardedDeadline;
  };

  auto tearDown = [&]() {
    if (killDeadline) return;
    signalRunningRanks(ranks, SIGTERM);
    killDeadline = Clock::now() + kTerminateGrace;
  };

  while (runningRanks > 0) {
    std::vector<pollfd> pollFds{{signalReader.get(), POLLIN, 0}};
    std::vector<OutputRelay*> pollRelays{nullptr};  // parallel to pollFds
    for (Rank& rank : ranks) {
      for (OutputRelay& relay : rank.relays) {
        if (!relay.source.isOpen()) continue;
        pollFds.push_back({relay.source.get(), POLLIN, 0});
        pollRelays.push_back(&relay);
      }
    }
    int timeoutMs = -1;
    if (deadline() && !killSent) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline() - Clock::now());
      timeoutMs = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    int ready = ::poll(pollFds.data(), pollFds.size(), timeoutMs);
    if (ready < 0 && errno != EINTR) {
      std::perror("braidrun: poll");
      tearDown();
    }

    if (deadline() && !killSent && Clock::now() >= *deadline()) {
      signalRunningRanks(ranks, SIGKILL);
      killSent = true;
    }
    for (size_t i = 1; ready > 0 && i < pollFds.size(); ++i) {
      if (pollFds[i].revents != 0) relayOutput(*pollRelays[i], false);
    }
    if (ready <= 0 || pollFds[0].revents == 0) continue;

    std::vector<int> signals;
    for (signalfd_siginfo info{};
         ::read(signalReader.get(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info));)
      signals.push_back(static_cast<int>(info.ssi_signo));
    for (int signo : signals) {
      if (signo == SIGCHLD) continue;
      std::fprintf(stderr, "braidrun: forwarding signal %d (%s) to the ranks\n", signo,
                   strsignal(signo));
      signalRunningRanks(ranks, signo);
      // A rank that ignores it, or is stuck in a driver call, must not
      // outlive the launcher: a run stopped at its time limit would leave
      // it holding the GPU.
      if (endsTheJob(signo) && !forwardedDeadline) {
        forwardedDeadline = Clock::now() + kTerminateGrace;
        endedBySignal = signo;
      }
    }
    // Reap every exited rank, whatever signal woke us: SIGCHLDs may merge.
    // Failures reaped together are all reported, since which came first (the
    // cause, not a peer that saw it) is unknown; later ones are our teardown.
    const bool tearingDown = killDeadline.has_value();
    for (Rank& rank : ranks) {
      int status = 0;
      if (!rank.running || ::waitpid(rank.pid, &status, WNOHANG) != rank.pid) continue;
      rank.running = false;
      --runningRanks;
      for (OutputRelay& relay : rank.relays) {
        if (relay.source.isOpen()) relayOutput(relay, true);
      }
      bool failed = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
      if (!failed || tearingDown) continue;
      writeAll(STDERR_FILENO, describeFailure(rank, status));
      if (exitCode == 0) {
        exitCode = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
      }
      tearDown();
    }
  }
  // A rank's first process is reaped, but what it started (a program under a
  // shell wrapper that died at once) may still run in its process group:
  // after a teardown or a signal that ends the job, the groups get what is
  // left of the grace period, then SIGKILL.
  if (const auto end = deadline()) {
    auto groupsLeft = [&] {
      return std::any_of(ranks.begin(), ranks.end(),
                         [](const Rank& rank) { return ::kill(-rank.pid, 0) == 0; });
    };
    while (groupsLeft() && Clock::now() < *end)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (const Rank& rank : ranks) (void)::kill(-rank.pid, SIGKILL);
  }
  // Interrupted, the run never reports success, whatever the ranks did.
  if (exitCode == 0 && endedBySignal != 0) exitCode = 128 + endedBySignal;
  return exitCode;
}
