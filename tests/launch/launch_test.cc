// braidCommInitFromEnv under every launcher convention of the contract:
// braidrun, Open MPI's mpirun, torchrun's variables and Slurm's variables.
// Each runs tests/launch/env_rank as real processes.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace {

std::string envOrFail(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// MASTER_PORT for a test whose rank 0 listens on the port after it
// (docs/ENVIRONMENT.md): one below a free port.
std::string masterPortBeforeAFreePort() {
  int port = 0;
  while (port < 2) port = freePort();
  return std::to_string(port - 1);
}

// Runs a shell command, returns (exit status, combined output).
std::pair<int, std::string> run(const std::string& command) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

// Forks one process per rank with `variables(rank)` added to the
// environment, waits for all, and returns how many exited 0.
int runRanks(int n, const std::function<std::map<std::string, std::string>(int)>& variables) {
  std::vector<pid_t> pids;
  const std::string program = envOrFail("ENV_RANK");
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      for (auto& [k, v] : variables(r)) setenv(k.c_str(), v.c_str(), 1);
      setenv("BRAID_TIMEOUT", "30", 1);
      execl(program.c_str(), program.c_str(), nullptr);
      _exit(127);
    }
    pids.push_back(pid);
  }
  int ok = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

TEST(Launch, Braidrun) {
  auto [status, out] = run(envOrFail("BRAIDRUN") + " -n 4 " + envOrFail("ENV_RANK"));
  EXPECT_EQ(status, 0) << out;
  for (int r = 0; r < 4; ++r) {
    char line[64];
    std::snprintf(line, sizeof(line), "[%d] rank %d of 4 ok", r, r);
    EXPECT_NE(out.find(line), std::string::npos) << out;
  }
}

// With BRAID_DEBUG=INFO every rank says where its init's time went, each
// phase with its seconds: a slow start-up names its culprit.
TEST(Launch, InfoLogSaysWhereInitTimeWent) {
  auto [status, out] =
      run("BRAID_DEBUG=INFO " + envOrFail("BRAIDRUN") + " -n 3 " + envOrFail("ENV_RANK"));
  EXPECT_EQ(status, 0) << out;
  for (int r = 0; r < 3; ++r) {
    const std::string prefix = "rank " + std::to_string(r) + ": init took ";
    const size_t at = out.find(prefix);
    ASSERT_NE(at, std::string::npos) << out;
    const std::string line = out.substr(at, out.find('\n', at) - at);
    for (const char* phase : {"rendezvous", "topology", "all ranks joined", "sockets",
                              "shared memory and rdma", "board", "link probe"})
      EXPECT_TRUE(
          std::regex_search(line, std::regex(std::string("[:,] ") + phase + " [0-9]+\\.[0-9]{3}")))
          << phase << ": " << line;
  }
}

// The longest BRAID_HOSTID allowed makes each rank's published description
// far longer than an address: rank 0 used to refuse it, and init failed.
TEST(Launch, LongestHostIdJoins) {
  auto [status, out] = run("env BRAID_HOSTID=" + std::string(256, 'h') + " " +
                           envOrFail("BRAIDRUN") + " -n 2 " + envOrFail("ENV_RANK"));
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("[1] rank 1 of 2 ok"), std::string::npos) << out;
}

// A /dev/shm too small for 1 MiB rings between every pair of 6 ranks (15
// pairs of 2 MiB in 24 MiB): the rings shrink to fit half of it, with a
// warning that names the fix, and every pair still shares memory (forced
// here, so a pair on TCP would fail init). Before, the pairs beyond the room
// fell back to TCP. The small /dev/shm is a tmpfs in a mount namespace of
// the test's own.
TEST(Launch, SmallDevShmShrinksTheRings) {
  if (run("unshare -m true").first != 0)
    GTEST_SKIP() << "cannot make a mount namespace here (unshare -m: needs root or "
                    "CAP_SYS_ADMIN), so no small /dev/shm to try";
  auto [status, out] =
      run("unshare -m sh -c 'mount -t tmpfs -o size=24m tmpfs /dev/shm && "
          "env BRAID_TRANSPORT=shm " +
          envOrFail("BRAIDRUN") + " -n 6 " + envOrFail("ENV_RANK") + "'");
  EXPECT_EQ(status, 0) << out;
  for (int r = 0; r < 6; ++r)
    EXPECT_NE(out.find("rank " + std::to_string(r) + " of 6 ok"), std::string::npos) << out;
  EXPECT_NE(out.find("shared-memory rings of 262144 bytes instead of 1048576"), std::string::npos)
      << out;
  EXPECT_NE(out.find("--shm-size"), std::string::npos) << out;

  // No shared memory asked for: nothing to fit, nothing to warn about.
  auto [tcpStatus, tcpOut] =
      run("unshare -m sh -c 'mount -t tmpfs -o size=24m tmpfs /dev/shm && "
          "env BRAID_TRANSPORT=tcp " +
          envOrFail("BRAIDRUN") + " -n 6 " + envOrFail("ENV_RANK") + "'");
  EXPECT_EQ(tcpStatus, 0) << tcpOut;
  EXPECT_EQ(tcpOut.find("shared-memory rings of"), std::string::npos) << tcpOut;
}

TEST(Launch, OpenMpiMpirun) {
  const std::string address = "127.0.0.1:" + std::to_string(freePort());
  // Root may run mpirun only when it says so; CI runs as root.
  auto [status, out] =
      run("mpirun --allow-run-as-root --oversubscribe -np 3 -x BRAID_ADDR=" + address +
          " -x BRAID_TIMEOUT=30 " + envOrFail("ENV_RANK"));
  EXPECT_EQ(status, 0) << out;
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(out.find("rank " + std::to_string(r) + " of 3 ok"), std::string::npos) << out;
}

TEST(Launch, TorchrunVariables) {
  const std::string port = masterPortBeforeAFreePort();
  int ok = runRanks(3, [&](int r) {
    return std::map<std::string, std::string>{{"RANK", std::to_string(r)},
                                              {"WORLD_SIZE", "3"},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", port}};
  });
  EXPECT_EQ(ok, 3);
}

TEST(Launch, SlurmVariables) {
  const std::string port = masterPortBeforeAFreePort();
  int ok = runRanks(2, [&](int r) {
    return std::map<std::string, std::string>{{"SLURM_PROCID", std::to_string(r)},
                                              {"SLURM_NTASKS", "2"},
                                              {"MASTER_ADDR", "localhost"},
                                              {"MASTER_PORT", port}};
  });
  EXPECT_EQ(ok, 2);
}

TEST(Launch, MissingVariablesAreAClearError) {
  auto [status, out] = run("env -u BRAID_RANK -u RANK -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID " +
                           envOrFail("ENV_RANK"));
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("BRAID_RANK"), std::string::npos) << out;
}

TEST(Launch, PartialVariablesNameTheMissingOne) {
  std::string command = "env BRAID_RANK=0 BRAID_ADDR=127.0.0.1:1 ";
  command.append(envOrFail("ENV_RANK"));
  auto [status, out] = run(command);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("BRAID_WORLD_SIZE"), std::string::npos) << out;
}

}  // namespace
