// Ranks that share a GPU without MPS are told so: the first GPU call of a
// host's first rank warns, once, where more ranks share the host than it
// has NVIDIA GPUs and the driver does not report MPS on. The host's GPUs
// come from a topology file (BRAID_TOPO_FILE: one NVIDIA GPU), the MPS
// attribute from the stand-in driver (FAKE_CUDA_MPS; unset: a driver that
// does not know it). Each rank catches its own stderr around its calls.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "braid.h"
#include "gpu_ranks.h"

namespace {

using namespace braid::testing::gpu_ranks;

constexpr const char* kWarning = "ranks of this host share its 1 NVIDIA GPU";

class SharedGpu : public ForkedGpuRanks {
 protected:
  void SetUp() override {
    char path[] = "/tmp/braid-one-gpu-XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    topologyFile_ = path;
    std::ofstream(topologyFile_)
        << R"({"hostname": "vm", "host_id": "vm/one-gpu", "pid": 1, "numa_node": 0,)"
        << R"( "cores": "0-1", "devices": [{"kind": "gpu", "bus_id": "0000:3b:00.0",)"
        << R"( "vendor": "0x10de", "device": "0x2335", "numa_node": 0, "net": [], "ib": []}]})";
  }
  void TearDown() override { std::remove(topologyFile_.c_str()); }

  RankSetup setup(const char* mps) const {
    RankSetup s;
    s.environment = {"BRAID_TOPO_FILE=" + topologyFile_};
    if (mps != nullptr) s.environment.push_back(std::string("FAKE_CUDA_MPS=") + mps);
    return s;
  }

  std::string topologyFile_;
};

// Two GPU calls with stderr sent to a file; what they printed.
std::string stderrOfTwoBroadcasts(Rank& r, float* send, float* recv, int& failed) {
  char path[] = "/tmp/braid-stderr-XXXXXX";
  const int file = mkstemp(path);
  const int saved = dup(2);
  if (file < 0 || saved < 0) {
    failed = 5;
    return "";
  }
  dup2(file, 2);
  failed = broadcastFromTheLastRank(r, send, recv);
  if (failed == 0) failed = broadcastFromTheLastRank(r, send, recv);
  dup2(saved, 2);
  close(saved);
  close(file);
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::remove(path);
  return text.str();
}

template <bool kWarned>
int warnsOnTheFirstRankOnly(Rank& r) {
  float* send = r.allocate(kCount);
  float* recv = r.allocate(kCount);
  RANK_CHECK(10, send != nullptr && recv != nullptr);
  int failed = 0;
  const std::string printed = stderrOfTwoBroadcasts(r, send, recv, failed);
  if (failed != 0) return failed;
  const size_t first = printed.find(kWarning);
  if (kWarned && r.rank() == 0) {
    RANK_CHECK(20, first != std::string::npos);
    RANK_CHECK(21, printed.find("nvidia-cuda-mps-control -d") != std::string::npos);
    RANK_CHECK(22, printed.find(kWarning, first + 1) == std::string::npos);  // once
  } else {
    RANK_CHECK(23, first == std::string::npos);
  }
  return 0;
}

TEST_F(SharedGpu, TwoRanksOnOneGpuWithoutMpsAreTold) {
  expectEveryRankPassed(runRanks(2, warnsOnTheFirstRankOnly<true>, setup("0")));
}

TEST_F(SharedGpu, ADriverThatDoesNotSayWhetherMpsIsOnIsTakenAsOff) {
  expectEveryRankPassed(runRanks(2, warnsOnTheFirstRankOnly<true>, setup(nullptr)));
}

TEST_F(SharedGpu, WithMpsNothingIsSaid) {
  expectEveryRankPassed(runRanks(2, warnsOnTheFirstRankOnly<false>, setup("1")));
}

}  // namespace
