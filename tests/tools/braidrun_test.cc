// Runs the real braidrun executable on small shell commands and checks what
// the ranks saw and what braidrun printed and returned.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// BRAIDRUN is set by the build's test definition; the fallback finds the
// launcher next to this test in the build tree when run by hand.
std::string launcherPath() {
  if (const char* path = std::getenv("BRAIDRUN"); path != nullptr && *path != '\0') return path;
  return (fs::read_symlink("/proc/self/exe").parent_path() / "../../tools/braidrun").string();
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct Outcome {
  int exitCode = -1;  // -1 when killed by a signal or still running at the deadline
  std::string out;    // braidrun's stdout
  std::string err;    // braidrun's stderr
  double seconds = 0;
};

// One braidrun process whose stdout and stderr go to files in a fresh
// directory; files (not pipes) so that nothing blocks if the test is slow.
class Launcher {
 public:
  // `wrapper`, when given, is a command that execs braidrun with its own
  // changes to what braidrun inherits (its first word a full path).
  explicit Launcher(const std::vector<std::string>& args,
                    const std::vector<std::string>& wrapper = {}) {
    dir_ = fs::temp_directory_path() /
           ("braidrun_test." + std::to_string(::getpid()) + "." + std::to_string(counter_++));
    fs::create_directories(dir_);
    std::vector<std::string> argv = wrapper;
    argv.push_back(launcherPath());
    argv.insert(argv.end(), args.begin(), args.end());
    // The ranks must see exactly the BRAID_* variables braidrun sets, plus
    // one planted here to check that braidrun overrides it.
    std::vector<std::string> env;
    for (char** var = environ; *var != nullptr; ++var) {
      if (std::string_view(*var).substr(0, 6) != "BRAID_") env.emplace_back(*var);
    }
    env.emplace_back("BRAID_RANK=99");
    std::vector<char*> argvPtrs, envPtrs;
    for (auto& word : argv) argvPtrs.push_back(word.data());
    for (auto& var : env) envPtrs.push_back(var.data());
    argvPtrs.push_back(nullptr);
    envPtrs.push_back(nullptr);
    std::string outPath = (dir_ / "out").string(), errPath = (dir_ / "err").string();
    start_ = Clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      int out = ::open(outPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      int err = ::open(errPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(err, STDERR_FILENO);
      ::execve(argvPtrs[0], argvPtrs.data(), envPtrs.data());
      ::_exit(126);
    }
  }
  ~Launcher() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  pid_t pid() const { return pid_; }
  std::string currentOut() const { return readFile(dir_ / "out"); }

  // Waits up to `limit` for braidrun to exit.
  Outcome wait(std::chrono::seconds limit = std::chrono::seconds(30)) {
    Outcome outcome;
    int status = 0;
    while (true) {
      pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        reaped_ = true;
        if (WIFEXITED(status)) outcome.exitCode = WEXITSTATUS(status);
        break;
      }
      if (Clock::now() - start_ > limit) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    outcome.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    outcome.out = readFile(dir_ / "out");
    outcome.err = readFile(dir_ / "err");
    return outcome;
  }

 private:
  static inline int counter_ = 0;
  fs::path dir_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  Clock::time_point start_;
};

Outcome runLauncher(const std::vector<std::string>& args) {
  return Launcher(args).wait();
}

Outcome runShell(int numRanks, const std::string& script) {
  return runLauncher({"-n", std::to_string(numRanks), "sh", "-c", script});
}

TEST(Braidrun, SetsRankVariables) {
  Outcome run = runShell(4, "env | grep '^BRAID_' | sort | tr '\\n' ' '; echo");
  ASSERT_EQ(run.exitCode, 0) << run.err;
  std::regex lineFormat(R"(\[(\d+)\] BRAID_ADDR=127\.0\.0\.1:(\d+) BRAID_RANK=(\d+) )"
                        R"(BRAID_SECRET=([0-9a-f]{32}) BRAID_WORLD_SIZE=4 )");
  std::set<std::string> ranks, addrs, secrets;
  std::vector<std::string> lines = splitLines(run.out);
  ASSERT_EQ(lines.size(), 4u) << run.out;
  for (const std::string& line : lines) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, lineFormat)) << line;
    EXPECT_EQ(match[1], match[3]) << "prefix names another rank: " << line;
    EXPECT_GT(std::stoi(match[2]), 0);
    ranks.insert(match[3]);
    addrs.insert(match[2]);
    secrets.insert(match[4]);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2", "3"}));
  EXPECT_EQ(addrs.size(), 1u) << "ranks disagree on BRAID_ADDR";
  EXPECT_EQ(secrets.size(), 1u) << "ranks disagree on BRAID_SECRET";
}

// The CPUs this test may run on, as the kernel lists them ("0-3,6").
std::string allowedCpus() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("Cpus_allowed_list:"))
      return line.substr(line.find_first_not_of(" \t", 18));
  return "";
}

int countAllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
}

TEST(Braidrun, BindsEachRankToOneCpuRoundRobin) {
  const int cpus = countAllowedCpus();
  ASSERT_GT(cpus, 0);
  const int numRanks = cpus + 1;  // one more rank than CPUs: the first CPU is used twice
  Outcome run = runShell(numRanks, "grep Cpus_allowed_list /proc/self/status | cut -f2");
  ASSERT_EQ(run.exitCode, 0) << run.err;
  std::vector<std::string> lines = splitLines(run.out);
  ASSERT_EQ(lines.size(), static_cast<size_t>(numRanks)) << run.out;
  std::map<int, std::string> cpuOf;
  for (const std::string& line : lines) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, std::regex(R"(\[(\d+)\] (\d+))"))) << line;
    cpuOf[std::stoi(match[1])] = match[2];
  }
  std::set<std::string> distinct;
  for (int r = 0; r < cpus; ++r) distinct.insert(cpuOf[r]);
  EXPECT_EQ(distinct.size(), static_cast<size_t>(cpus)) << run.out;
  EXPECT_EQ(cpuOf[cpus], cpuOf[0]) << run.out;
}

TEST(Braidrun, BindNoneKeepsEveryCpu) {
  Outcome run = runLauncher({"-n", "2", "--bind", "none", "sh", "-c",
                             "grep Cpus_allowed_list /proc/self/status | cut -f2"});
  ASSERT_EQ(run.exitCode, 0) << run.err;
  std::vector<std::string> lines = splitLines(run.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[0] " + allowedCpus(), "[1] " + allowedCpus()}));
}

TEST(Braidrun, SecretDiffersBetweenRuns) {
  Outcome first = runShell(1, "echo $BRAID_SECRET");
  Outcome second = runShell(1, "echo $BRAID_SECRET");
  ASSERT_EQ(first.exitCode, 0);
  ASSERT_EQ(second.exitCode, 0);
  EXPECT_NE(first.out, second.out);
}

TEST(Braidrun, PortOption) {
  Outcome run = runLauncher({"--port", "23456", "-n", "2", "--", "sh", "-c", "echo $BRAID_ADDR"});
  ASSERT_EQ(run.exitCode, 0) << run.err;
  std::vector<std::string> lines = splitLines(run.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[0] 127.0.0.1:23456", "[1] 127.0.0.1:23456"}));
}

TEST(Braidrun, CommandFlagsAreNotItsOwn) {
  Outcome run =
      runLauncher({"--np", "1", "sh", "-c", "printf '%s\\n' \"$*\"", "sh", "-n", "5", "--port"});
  ASSERT_EQ(run.exitCode, 0) << run.err;
  EXPECT_EQ(run.out, "[0] -n 5 --port\n");
}

TEST(Braidrun, PrefixesEveryLineOfBothStreams) {
  // Many lines per rank, so that reads split lines; the last line of each
  // stream has no newline and must still arrive, whole, at exit.
  Outcome run = runShell(3,
                         "i=0; while [ $i -lt 500 ]; do echo \"out $BRAID_RANK $i\"; "
                         "echo \"err $BRAID_RANK $i\" >&2; i=$((i+1)); done; "
                         "printf \"tail $BRAID_RANK\"; printf 'errtail' >&2");
  ASSERT_EQ(run.exitCode, 0) << run.err;
  for (const auto& [text, kind] : {std::pair{run.out, "out"}, std::pair{run.err, "err"}}) {
    std::map<int, int> nextIndex;  // per rank: lines must arrive in order
    std::set<int> sawTail;
    std::regex numbered(std::string(R"(\[(\d)\] )") + kind + R"( (\d) (\d+))");
    std::regex tail(std::string(R"(\[(\d)\] )") +
                    (kind == std::string("out") ? "tail (\\d)" : "errtail"));
    for (const std::string& line : splitLines(text)) {
      std::smatch match;
      if (std::regex_match(line, match, numbered)) {
        EXPECT_EQ(match[1], match[2]) << line;
        int rank = std::stoi(match[1]);
        EXPECT_EQ(std::stoi(match[3]), nextIndex[rank]++) << line;
      } else if (std::regex_match(line, match, tail)) {
        sawTail.insert(std::stoi(match[1]));
      } else {
        ADD_FAILURE() << "unexpected " << kind << " line: '" << line << "'";
      }
    }
    for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(nextIndex[rank], 500) << kind;
    EXPECT_EQ(sawTail, (std::set<int>{0, 1, 2})) << kind;
  }
}

TEST(Braidrun, ExitsZeroWhenAllRanksSucceed) {
  Outcome run = runShell(4, "exit 0");
  EXPECT_EQ(run.exitCode, 0) << run.err;
  EXPECT_EQ(run.err, "");
}

TEST(Braidrun, FailingRankTearsDownTheOthers) {
  Outcome run = runShell(4, "if [ $BRAID_RANK = 1 ]; then exit 3; fi; sleep 30");
  EXPECT_EQ(run.exitCode, 3) << run.err;
  EXPECT_LT(run.seconds, 10);
  EXPECT_TRUE(std::regex_search(run.err, std::regex(R"(rank 1 \(pid \d+\) exited with status 3)")))
      << run.err;
  EXPECT_EQ(run.err.find("rank 0"), std::string::npos) << "teardown reported as failure";
}

TEST(Braidrun, RankIgnoringSigtermIsKilledAfterGrace) {
  Outcome run = runShell(
      2, "if [ $BRAID_RANK = 0 ]; then sleep 1; exit 5; fi; trap '' TERM; sleep 20 & wait; wait");
  EXPECT_EQ(run.exitCode, 5) << run.err;
  EXPECT_GE(run.seconds, 2.5);
  EXPECT_LT(run.seconds, 10);
}

TEST(Braidrun, ReportsRankKilledBySignal) {
  Outcome run = runShell(2, "if [ $BRAID_RANK = 1 ]; then kill -KILL $$; fi; sleep 30");
  EXPECT_EQ(run.exitCode, 128 + SIGKILL) << run.err;
  EXPECT_LT(run.seconds, 10);
  EXPECT_TRUE(std::regex_search(
      run.err, std::regex(R"(rank 1 \(pid \d+\) was killed by signal 9 \(Killed\))")))
      << run.err;
}

// The pids `count` ranks print as "pid N" lines (up to 10 s).
std::vector<pid_t> printedRankPids(Launcher& launcher, size_t count) {
  std::vector<pid_t> rankPids;
  for (auto deadline = Clock::now() + std::chrono::seconds(10);
       rankPids.size() < count && Clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    rankPids.clear();
    std::regex pidLine(R"(\[\d\] pid (\d+))");
    for (const std::string& line : splitLines(launcher.currentOut())) {
      std::smatch match;
      if (std::regex_match(line, match, pidLine)) rankPids.push_back(std::stoi(match[1]));
    }
  }
  return rankPids;
}

TEST(Braidrun, ForwardsSigtermToRanks) {
  Launcher launcher({"-n", "3", "sh", "-c", "echo pid $$; exec sleep 30"});
  const std::vector<pid_t> rankPids = printedRankPids(launcher, 3);
  ASSERT_EQ(rankPids.size(), 3u) << launcher.currentOut();
  ASSERT_EQ(::kill(launcher.pid(), SIGTERM), 0);
  Outcome run = launcher.wait(std::chrono::seconds(10));
  EXPECT_EQ(run.exitCode, 128 + SIGTERM) << run.err;
  EXPECT_LT(run.seconds, 10);
  EXPECT_NE(run.err.find("killed by signal 15 (Terminated)"), std::string::npos) << run.err;
  // braidrun reaped them, so they no longer exist at all.
  for (pid_t pid : rankPids) EXPECT_NE(::kill(pid, 0), 0) << "rank pid " << pid << " survived";
}

// Ranks that ignore the SIGTERM it forwards are killed after the grace
// period rather than left running after the launcher.
TEST(Braidrun, KillsRanksThatIgnoreAForwardedSigterm) {
  Launcher launcher({"-n", "2", "sh", "-c", "trap '' TERM; echo pid $$; exec sleep 60"});
  const std::vector<pid_t> rankPids = printedRankPids(launcher, 2);
  ASSERT_EQ(rankPids.size(), 2u) << launcher.currentOut();
  ASSERT_EQ(::kill(launcher.pid(), SIGTERM), 0);
  Outcome run = launcher.wait(std::chrono::seconds(20));
  EXPECT_EQ(run.exitCode, 128 + SIGKILL) << run.err;
  EXPECT_LT(run.seconds, 15);
  for (pid_t pid : rankPids) EXPECT_NE(::kill(pid, 0), 0) << "rank pid " << pid << " survived";
}

// Whether `pid` no longer runs: gone, or a zombie whose new parent (an
// init that does not reap, in some containers) left it.
bool noLongerRuns(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z';
}

// Up to `limit` for every one of `pids` to stop running.
bool allStopWithin(const std::vector<pid_t>& pids, std::chrono::seconds limit) {
  for (auto deadline = Clock::now() + limit; Clock::now() < deadline;) {
    if (std::all_of(pids.begin(), pids.end(), noLongerRuns)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A rank's command that dies at once of the forwarded SIGTERM (a shell
// wrapper) while what it started ignores it (python with a handler, or in a
// driver call): the rank's first process is reaped at once, but the rest of
// its process group must still be killed after the grace period. Before,
// braidrun exited as soon as the wrappers were reaped and left them running.
TEST(Braidrun, KillsWhatARankStartedOnceTheRankItselfIsGone) {
  Launcher launcher(
      {"-n", "2", "sh", "-c", "sh -c 'trap \"\" TERM; echo pid $$; exec sleep 60' & wait"});
  const std::vector<pid_t> started = printedRankPids(launcher, 2);
  ASSERT_EQ(started.size(), 2u) << launcher.currentOut();
  ASSERT_EQ(::kill(launcher.pid(), SIGTERM), 0);
  Outcome run = launcher.wait(std::chrono::seconds(20));
  EXPECT_EQ(run.exitCode, 128 + SIGTERM) << run.err;
  EXPECT_TRUE(allStopWithin(started, std::chrono::seconds(2))) << "what the ranks started survived";
}

// The signals a session or a scheduler sends besides SIGTERM and SIGINT
// reach the ranks too: SIGHUP (an ssh session that drops) ended braidrun
// alone, and ranks that ignore SIGTERM (all its death signal sent them)
// survived it.
TEST(Braidrun, ForwardsSighupToRanks) {
  Launcher launcher({"-n", "2", "sh", "-c", "trap '' TERM; echo pid $$; exec sleep 60"});
  const std::vector<pid_t> rankPids = printedRankPids(launcher, 2);
  ASSERT_EQ(rankPids.size(), 2u) << launcher.currentOut();
  ASSERT_EQ(::kill(launcher.pid(), SIGHUP), 0);
  Outcome run = launcher.wait(std::chrono::seconds(20));
  EXPECT_EQ(run.exitCode, 128 + SIGHUP) << run.err;
  EXPECT_NE(run.err.find("forwarding signal 1"), std::string::npos) << run.err;
  EXPECT_TRUE(allStopWithin(rankPids, std::chrono::seconds(2))) << "ranks survived";
}

// The signal mask (SigBlk) or caught set (SigCgt) of a process, as a bit
// set: bit s-1 stands for signal s.
uint64_t signalSet(pid_t pid, const std::string& field) {
  for (const std::string& line : splitLines(readFile("/proc/" + std::to_string(pid) + "/status"))) {
    if (line.starts_with(field + ":"))
      return std::stoull(line.substr(field.size() + 1), nullptr, 16);
  }
  return 0;
}

// braidrun takes its signals from a signalfd, with no handler: a handler
// depends on the process's runtime to be run at all, and under
// ThreadSanitizer, which defers handlers to its own safe points, a child's
// SIGCHLD was sometimes never handled and braidrun waited forever for ranks
// that had long exited. The ranks must not inherit the mask.
TEST(Braidrun, TakesSignalsWithoutHandlersAndRanksInheritNoMask) {
  Launcher launcher({"-n", "2", "sh", "-c", "echo pid $$; exec sleep 30"});
  const std::vector<pid_t> rankPids = printedRankPids(launcher, 2);
  ASSERT_EQ(rankPids.size(), 2u) << launcher.currentOut();
  uint64_t forwarded = 0;
  for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD})
    forwarded |= uint64_t{1} << (signo - 1);
  EXPECT_EQ(signalSet(launcher.pid(), "SigCgt") & forwarded, 0u);
  EXPECT_EQ(signalSet(launcher.pid(), "SigBlk") & forwarded, forwarded);
  for (pid_t pid : rankPids) EXPECT_EQ(signalSet(pid, "SigBlk") & forwarded, 0u) << pid;
  ASSERT_EQ(::kill(launcher.pid(), SIGTERM), 0);
  Outcome run = launcher.wait(std::chrono::seconds(10));
  EXPECT_EQ(run.exitCode, 128 + SIGTERM) << run.err;
}

// SIGCHLD ignored by whatever started braidrun (it stays so across exec)
// would have the kernel reap the ranks itself, and braidrun wait for ever
// for exits it could no longer see.
TEST(Braidrun, ReapsRanksWhenStartedWithSigchldIgnored) {
  Launcher launcher({"-n", "2", "sh", "-c", "exit $BRAID_RANK"},
                    {"/usr/bin/perl", "-e", "$SIG{CHLD} = 'IGNORE'; exec @ARGV"});
  Outcome run = launcher.wait(std::chrono::seconds(10));
  EXPECT_EQ(run.exitCode, 1) << run.err;
  EXPECT_NE(run.err.find("rank 1 (pid"), std::string::npos) << run.err;
}

// A braidrun killed outright (the OOM killer, kill -9) takes its ranks with
// it, those that ignore SIGTERM too.
TEST(Braidrun, RanksDieWithAKilledLauncher) {
  Launcher launcher({"-n", "2", "sh", "-c", "trap '' TERM; echo pid $$; exec sleep 60"});
  const std::vector<pid_t> rankPids = printedRankPids(launcher, 2);
  ASSERT_EQ(rankPids.size(), 2u) << launcher.currentOut();
  ASSERT_EQ(::kill(launcher.pid(), SIGKILL), 0);
  launcher.wait(std::chrono::seconds(5));
  EXPECT_TRUE(allStopWithin(rankPids, std::chrono::seconds(3))) << "ranks survived";
}

// Interrupted, braidrun never reports success, even where every rank
// handled the signal and exited 0 (as mpirun and torchrun): a script's
// `braidrun ... && publish` must not go on as if the job had finished.
TEST(Braidrun, AnInterruptedRunNeverExitsZero) {
  Launcher launcher(
      {"-n", "2", "sh", "-c", "trap 'exit 0' TERM; echo pid $$; while :; do sleep 0.1; done"});
  ASSERT_EQ(printedRankPids(launcher, 2).size(), 2u) << launcher.currentOut();
  ASSERT_EQ(::kill(launcher.pid(), SIGTERM), 0);
  Outcome run = launcher.wait(std::chrono::seconds(20));
  EXPECT_EQ(run.exitCode, 128 + SIGTERM) << run.err;
}

// braidrun's stdout, a pipe that another process made nonblocking (some CI
// runners do), whose reader lags: every rank's line still arrives. Before,
// a write that met a full pipe dropped the rest of what it relayed.
TEST(Braidrun, ANonblockingStdoutThatFillsLosesNoLine) {
  int pipeFds[2];
  ASSERT_EQ(::pipe(pipeFds), 0);
  ASSERT_EQ(::fcntl(pipeFds[1], F_SETFL, O_NONBLOCK), 0);
  const std::string path = launcherPath();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(pipeFds[1], STDOUT_FILENO);
    ::close(pipeFds[0]);
    ::close(pipeFds[1]);
    ::execl(path.c_str(), path.c_str(), "-n", "3", "sh", "-c",
            "i=0; while [ $i -lt 5000 ]; do echo line $i; i=$((i+1)); done",
            static_cast<char*>(nullptr));
    ::_exit(126);
  }
  ::close(pipeFds[1]);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the pipe fills meanwhile
  std::string out;
  char buffer[65536];
  for (ssize_t n; (n = ::read(pipeFds[0], buffer, sizeof buffer)) != 0;)
    if (n > 0) out.append(buffer, static_cast<size_t>(n));
  ::close(pipeFds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(splitLines(out).size(), 15000u);
}

// `command` run by sh, its exit status and what it printed (both streams).
std::pair<int, std::string> shell(const std::string& command) {
  FILE* pipe = ::popen(("(" + command + ") 2>&1").c_str(), "r");
  std::string out;
  char buffer[4096];
  for (size_t n; pipe != nullptr && (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;)
    out.append(buffer, n);
  const int status = pipe != nullptr ? ::pclose(pipe) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// braidrun holds two descriptors per rank. Under a low soft limit on open
// files it raises the limit to the hard one (the ranks keep the old one);
// where even that is too low it says so before starting any rank. It failed
// midway with "pipe: Too many open files" and exit 1, its ranks left behind.
TEST(Braidrun, RanksBeyondTheLimitOfOpenFilesAreRefusedUpFront) {
  const std::string launcher = launcherPath();
  auto [raised, raisedOut] =
      shell("ulimit -S -n 48; exec " + launcher + " -n 40 sh -c 'echo limit $(ulimit -S -n)'");
  EXPECT_EQ(raised, 0) << raisedOut;
  EXPECT_EQ(std::count(raisedOut.begin(), raisedOut.end(), '\n'), 40) << raisedOut;
  EXPECT_NE(raisedOut.find("limit 48"), std::string::npos) << raisedOut;
  auto [refused, refusedOut] = shell("ulimit -n 48; exec " + launcher + " -n 40 true");
  EXPECT_EQ(refused, 2) << refusedOut;
  EXPECT_NE(refusedOut.find("ulimit -n"), std::string::npos) << refusedOut;
}

TEST(Braidrun, BadUsageExitsTwo) {
  const std::vector<std::vector<std::string>> badUsages = {
      {},
      {"true"},
      {"-n"},
      {"-n", "0", "true"},
      {"-n", "-3", "true"},
      {"-n", "two", "true"},
      {"-n", "2"},
      {"-n", "2", "--"},
      {"-n", "2", "--port", "70000", "true"},
      {"-n", "2", "--bogus", "true"},
      {"-n", "2", "--bind", "socket", "true"},
      {"-n", "2", "--bind"},
      {"-n", "2", "no-such-command-braidrun-test"},
      {"-n", "2", "/no/such/dir/cmd"},
  };
  for (const auto& args : badUsages) {
    std::string joined;
    for (const auto& word : args) joined += word + " ";
    Outcome run = runLauncher(args);
    EXPECT_EQ(run.exitCode, 2) << "args: " << joined;
    EXPECT_NE(run.err.find("braidrun: "), std::string::npos) << "args: " << joined;
    EXPECT_EQ(run.out, "") << "args: " << joined;
  }
}

TEST(Braidrun, UnexecutableCommandFailsWith127) {
  fs::path script = fs::temp_directory_path() / ("braidrun_noexec." + std::to_string(::getpid()));
  std::ofstream(script) << "#!/bin/sh\necho hi\n";
  fs::permissions(script, fs::perms::owner_read | fs::perms::owner_write);
  Outcome run = runLauncher({"-n", "2", script.string()});
  fs::remove(script);
  EXPECT_EQ(run.exitCode, 127) << run.err;
  EXPECT_NE(run.err.find("cannot execute"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("exited with status 127"), std::string::npos) << run.err;
}

}  // namespace
