// What users see when things go wrong between real processes: mismatched
// calls, a peer that dies, a peer that stalls, an abort from another
// thread. Each must end in a clear error, quickly, on every rank involved.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "braid.h"

namespace {

struct RankReport {
  int result = -1;
  char message[512] = {};
  double seconds = 0;
};

// Seconds a rank may take to report before the test gives up on it and
// kills the ranks: a hang fails the test instead of stalling the suite.
// Below meson's limit for the test, so that this report comes first.
constexpr int kReportLimitSeconds = 100;

// A limit on how long a call may take, stretched by FAILURE_TIME_SCALE
// (meson.build sets it for sanitized builds, several times slower).
double scaled(double seconds) {
  const char* scale = std::getenv("FAILURE_TIME_SCALE");
  return scale != nullptr ? seconds * std::atof(scale) : seconds;
}

// True once process `pid` has exited (a zombie or reaped): its sockets are
// closed by then.
bool hasExited(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string field;
  // pid, (comm), state: a command name without spaces, as this test's is.
  if (!(stat >> field >> field >> field)) return true;
  return field == "Z" || field == "X";
}

// Forks `n` ranks sharing one unique id; each runs body(comm, rank) and
// reports the result code and last error of the call it marks as decisive.
// Rank 0 creates the id and the test relays it: the process that creates
// an id runs its rendezvous on a thread, and a process forked from one with
// threads may inherit a lock another thread held (an allocator's, under a
// sanitizer) and wait on it forever.
std::vector<RankReport> runRanks(int n, const char* timeout,
                                 const std::function<braidResult_t(braidComm_t, int)>& body) {
  setenv("BRAID_TIMEOUT", timeout, 1);
  int idUp[2];
  EXPECT_EQ(pipe(idUp), 0);
  std::vector<int> pipes(n), idDown(n, -1);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    int fds[2], down[2];
    EXPECT_EQ(pipe(fds), 0);
    EXPECT_EQ(pipe(down), 0);
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      close(down[1]);
      close(idUp[0]);
      braidUniqueId id;
      if (r == 0) {
        if (braidGetUniqueId(&id) != braidSuccess) _exit(2);
        if (write(idUp[1], &id, sizeof(id)) != sizeof(id)) _exit(2);
      } else if (read(down[0], &id, sizeof(id)) != sizeof(id)) {
        _exit(2);
      }
      RankReport report;
      braidComm_t comm = nullptr;
      if (braidCommInitRank(&comm, n, id, r) != braidSuccess) _exit(3);
      auto start = std::chrono::steady_clock::now();
      report.result = body(comm, r);
      report.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::strncpy(report.message, braidGetLastError(nullptr), sizeof(report.message) - 1);
      if (write(fds[1], &report, sizeof(report)) != sizeof(report)) _exit(4);
      braidCommDestroy(comm);
      _exit(0);
    }
    close(fds[1]);
    close(down[0]);
    pipes[r] = fds[0];
    idDown[r] = down[1];
    pids.push_back(pid);
  }
  close(idUp[1]);
  braidUniqueId id;
  const bool haveId = read(idUp[0], &id, sizeof(id)) == sizeof(id);
  EXPECT_TRUE(haveId) << "rank 0 could not create a unique id";
  for (int r = 1; r < n; ++r) {
    if (haveId) {
      EXPECT_EQ(write(idDown[r], &id, sizeof(id)), static_cast<ssize_t>(sizeof(id)));
    }
  }
  for (int fd : idDown) close(fd);
  close(idUp[0]);
  std::vector<RankReport> reports(n);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(kReportLimitSeconds);
  for (int r = 0; r < n; ++r) {
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now())
                                          .count());
    pollfd ready{pipes[r], POLLIN, 0};
    if (poll(&ready, 1, std::max(left, 0)) != 1) {
      ADD_FAILURE() << "rank " << r << " reported nothing within " << kReportLimitSeconds
                    << " s; killing the ranks";
      for (pid_t pid : pids) kill(pid, SIGKILL);
    }
    ssize_t got = read(pipes[r], &reports[r], sizeof(RankReport));
    if (got != sizeof(RankReport)) reports[r].result = -2;  // the rank died first
    close(pipes[r]);
  }
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  unsetenv("BRAID_TIMEOUT");
  return reports;
}

std::vector<float> buffer(1000, 1.0f);

TEST(Mismatch, DifferentCollectivesFailOnBothRanksNamingBothCalls) {
  auto reports = runRanks(2, "20", [](braidComm_t comm, int rank) {
    std::vector<float> data(1000, 1.0f);
    return rank == 0
               ? braidAllReduce(data.data(), data.data(), 1000, braidFloat32, braidSum, comm,
                                nullptr)
               : braidBroadcast(data.data(), data.data(), 1000, braidFloat32, 0, comm, nullptr);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(reports[r].result, braidInvalidUsage) << "rank " << r << ": " << reports[r].message;
    EXPECT_NE(std::string(reports[r].message).find("allreduce"), std::string::npos)
        << reports[r].message;
    EXPECT_NE(std::string(reports[r].message).find("broadcast"), std::string::npos)
        << reports[r].message;
    EXPECT_LT(reports[r].seconds, scaled(5.0));
  }
}

TEST(Mismatch, DifferentCountsFailOnBothRanks) {
  auto reports = runRanks(3, "20", [](braidComm_t comm, int rank) {
    std::vector<int32_t> data(2000, 1);
    size_t count = rank == 1 ? 2000 : 1000;
    return braidAllReduce(data.data(), data.data(), count, braidInt32, braidSum, comm, nullptr);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(reports[r].result, braidSuccess) << "rank " << r;
    EXPECT_LT(reports[r].seconds, scaled(5.0));
  }
  EXPECT_EQ(reports[1].result, braidInvalidUsage) << reports[1].message;
}

TEST(Mismatch, AnExtraCallOnOneRankIsDetected) {
  auto reports = runRanks(2, "20", [](braidComm_t comm, int rank) {
    std::vector<float> data(1000, 1.0f);
    if (rank == 1) braidBroadcast(data.data(), data.data(), 10, braidFloat32, 1, comm, nullptr);
    return braidAllReduce(data.data(), data.data(), 1000, braidFloat32, braidSum, comm, nullptr);
  });
  EXPECT_EQ(reports[0].result, braidInvalidUsage) << reports[0].message;
  EXPECT_LT(reports[0].seconds, scaled(5.0));
}

TEST(PeerFailure, DeadPeerGivesRemoteErrorNamingIt) {
  auto reports = runRanks(2, "20", [](braidComm_t comm, int rank) -> braidResult_t {
    if (rank == 1) _exit(0);  // dies without a word
    std::vector<float> data(1000, 1.0f);
    return braidAllReduce(data.data(), data.data(), 1000, braidFloat32, braidSum, comm, nullptr);
  });
  EXPECT_EQ(reports[0].result, braidRemoteError) << reports[0].message;
  EXPECT_NE(std::string(reports[0].message).find("rank 1"), std::string::npos)
      << reports[0].message;
  EXPECT_LT(reports[0].seconds, scaled(5.0));
}

// The first error may come from a survivor that gave up, not from the dead
// rank; the message must still name the dead one among the connections
// lost. Here rank 0 busy-polls throughout (it never sleeps, which is when a
// shared-memory connection reads its doorbell socket), rank 2 dies, and
// rank 1 aborts once rank 2 is gone, and 200 ms more.
TEST(PeerFailure, TheDeadRankIsNamedWhenAnotherFailsFirst) {
  setenv("BRAID_SPIN_US", "1000000", 1);  // the most it takes: 1 s
  // Rank 2's pid, for rank 1 (forked before it) to wait on.
  void* shared =
      mmap(nullptr, sizeof(pid_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* deadPid = new (shared) std::atomic<pid_t>(0);
  auto reports = runRanks(3, "20", [deadPid](braidComm_t comm, int rank) -> braidResult_t {
    if (rank == 2) {
      deadPid->store(getpid());
      _exit(0);
    }
    if (rank == 1) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while ((deadPid->load() == 0 || !hasExited(deadPid->load())) &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      braidCommAbort(comm);
      return braidSuccess;
    }
    std::vector<float> data(1000);
    return braidRecv(data.data(), data.size(), braidFloat32, 1, comm, nullptr);
  });
  unsetenv("BRAID_SPIN_US");
  munmap(shared, sizeof(pid_t));
  ASSERT_NE(reports[0].result, braidSuccess);
  const std::string message = reports[0].message;
  EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
  EXPECT_NE(message.find("ranks 1, 2]"), std::string::npos) << message;
}

TEST(PeerFailure, StalledPeerGivesTimeoutNamingIt) {
  auto reports = runRanks(2, "1", [](braidComm_t comm, int rank) -> braidResult_t {
    std::vector<float> data(1000, 1.0f);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(3));
      return braidSuccess;
    }
    return braidAllReduce(data.data(), data.data(), 1000, braidFloat32, braidSum, comm, nullptr);
  });
  EXPECT_EQ(reports[0].result, braidTimeout) << reports[0].message;
  EXPECT_NE(std::string(reports[0].message).find("rank 1"), std::string::npos)
      << reports[0].message;
  EXPECT_LT(reports[0].seconds, scaled(2.5));
}

// Two braid streams share the communicator's connections: the bytes that
// one stream's calls move are no progress of a call stuck on the other. Its
// timeout then fails the communicator, and so the other stream's calls, on
// both ranks.
TEST(PeerFailure, ACallStuckOnOneStreamTimesOutWhileAnotherStreamMovesBytes) {
  auto reports = runRanks(2, "1", [](braidComm_t comm, int rank) -> braidResult_t {
    braidStream_t stuck = nullptr, busy = nullptr;
    if (braidStreamCreate(comm, &stuck) != braidSuccess) return braidInternalError;
    if (braidStreamCreate(comm, &busy) != braidSuccess) return braidInternalError;
    // Rank 1 never sends what rank 0's stuck stream waits for.
    std::vector<float> never(1000, 0.0f);
    if (rank == 0 &&
        braidRecv(never.data(), never.size(), braidFloat32, 1, comm, stuck) != braidSuccess)
      return braidInternalError;
    // Meanwhile both ranks keep the other stream busy on the same
    // connection until a call fails, or rank 0 says that time is up (the
    // first element of each call carries its verdict, so that both ranks
    // make the same calls).
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    std::vector<int32_t> traffic(64 * 1024, 1);
    braidResult_t busyResult = braidSuccess;
    for (int32_t stop = 0; !stop && busyResult == braidSuccess;) {
      traffic[0] = rank == 0 && elapsed() > scaled(6.0) ? 1 : 0;
      busyResult = braidAllReduce(traffic.data(), traffic.data(), traffic.size(), braidInt32,
                                  braidMax, comm, busy);
      if (busyResult == braidSuccess) busyResult = braidStreamSynchronize(busy);
      stop = traffic[0];
    }
    const double busyEnded = elapsed();
    std::fprintf(stderr, "rank %d: the busy stream ended after %.2f s: %s\n", rank, busyEnded,
                 braidGetLastError(nullptr));
    if (busyResult == braidSuccess || busyEnded > scaled(2.5)) return braidInProgress;
    braidStreamDestroy(busy);
    if (rank == 1) {
      braidStreamDestroy(stuck);
      return busyResult;
    }
    const braidResult_t result = braidStreamSynchronize(stuck);
    const std::string message = braidGetLastError(nullptr);
    braidStreamDestroy(stuck);
    std::fprintf(stderr, "rank 0: the stuck call: %s\n", message.c_str());
    // Its error names it, and what it waited for.
    const bool named = message.find("braidRecv (peer 1)") != std::string::npos &&
                       message.find("receive from rank 1") != std::string::npos;
    return named ? result : braidInternalError;
  });
  EXPECT_EQ(reports[1].result, braidRemoteError) << reports[1].message;
  EXPECT_EQ(reports[0].result, braidTimeout) << reports[0].message;
}

TEST(Abort, FromAnotherThreadEndsTheCallWithinASecond) {
  auto reports = runRanks(2, "60", [](braidComm_t comm, int rank) -> braidResult_t {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(2));
      return braidSuccess;
    }
    std::thread aborter([comm] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      braidCommAbort(comm);
    });
    std::vector<float> data(1000, 1.0f);
    braidResult_t r =
        braidAllReduce(data.data(), data.data(), 1000, braidFloat32, braidSum, comm, nullptr);
    aborter.join();
    return r;
  });
  EXPECT_EQ(reports[0].result, braidInvalidUsage) << reports[0].message;
  EXPECT_NE(std::string(reports[0].message).find("aborted"), std::string::npos)
      << reports[0].message;
  EXPECT_LT(reports[0].seconds, scaled(1.2));
}

TEST(Init, UnreachableRankZeroFailsWithinTheTimeout) {
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
  // Rank 0 never joins: the others must give up after BRAID_TIMEOUT.
  setenv("BRAID_TIMEOUT", "1", 1);
  braidComm_t comm = nullptr;
  auto start = std::chrono::steady_clock::now();
  braidResult_t r = braidCommInitRank(&comm, 2, id, 1);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  unsetenv("BRAID_TIMEOUT");
  EXPECT_EQ(r, braidTimeout) << braidGetLastError(nullptr);
  EXPECT_LT(seconds, scaled(3.0));
}

}  // namespace
