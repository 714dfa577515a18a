// GPU calls a rank cannot pair with its peers' (tests/api/gpu_jobs_test.cc
// says how the forked ranks share the stand-in driver's GPU): GPU memory on
// one rank and host memory on another, and buffers on another GPU than the
// rank's earlier calls'. Every rank must fail such a call promptly, saying
// why, rather than wait for its peer until BRAID_TIMEOUT.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "braid.h"
#include "gpu_ranks.h"

namespace {

using namespace braid::testing::gpu_ranks;

// Rank 0 passes GPU buffers, rank 1 host buffers, to one AllGather, which
// must fail on both ranks within 20 s. Returns 0 or the step that failed;
// `found` gets braid's message where this rank found the mismatch itself
// (braidInvalidUsage), and stays empty where it failed with its peer's words
// or as a peer that gave up.
int allGatherOfMixedMemory(Rank& r, std::string& found, braidStream_t stream = nullptr) {
  std::vector<float> hostSend(kCount, 1.0f), hostRecv(2 * kCount);
  float* send = r.rank() == 0 ? r.allocate(kCount) : hostSend.data();
  float* recv = r.rank() == 0 ? r.allocate(2 * kCount) : hostRecv.data();
  RANK_CHECK(10, send != nullptr && recv != nullptr);
  const auto start = std::chrono::steady_clock::now();
  braidResult_t result = braidAllGather(send, recv, kCount, braidFloat32, r.comm, stream);
  if (stream != nullptr && result == braidSuccess) result = braidStreamSynchronize(stream);
  const auto took = std::chrono::steady_clock::now() - start;
  const std::string message = braidGetLastError(nullptr);
  RANK_CHECK(11, result == braidInvalidUsage || result == braidRemoteError);
  RANK_CHECK(12, took < std::chrono::seconds(20));
  r.broken = true;
  if (result == braidInvalidUsage) found = message;
  return 0;
}

// On one host rank 0 runs a GPU job over cuda_ipc, rank 1 a host call over
// the host connection, and neither ever sends what the other waits for.
// Each sees the other's call announced on the shared-memory board, so both
// fail within a second or so, saying which rank passed which memory, not
// after BRAID_TIMEOUT.
int gpuAgainstHostMemory(Rank& r, braidStream_t stream) {
  std::string message;
  if (const int failed = allGatherOfMixedMemory(r, message, stream)) return failed;
  if (message.empty()) return 0;
  RANK_CHECK(13, message.find("rank 0 passed GPU device memory and this rank host or managed "
                              "memory") != std::string::npos ||
                     message.find("rank 1 passed host or managed memory and this rank GPU device "
                                  "memory") != std::string::npos);
  RANK_CHECK(14, message.find("every rank must pass GPU device memory") != std::string::npos);
  return 0;
}

int gpuAgainstHostMemoryOnTheCallersThread(Rank& r) {
  return gpuAgainstHostMemory(r, nullptr);
}

// The same on a braid stream: the board carries an announcement line per
// stream, so a stalled call on any stream finds its peer's call there.
int gpuAgainstHostMemoryOnAStream(Rank& r) {
  braidStream_t stream = nullptr;
  RANK_CHECK(20, braidStreamCreate(r.comm, &stream) == braidSuccess);
  return gpuAgainstHostMemory(r, stream);
}

// And on a CUDA stream, where both calls run when the stream reaches them.
int gpuAgainstHostMemoryOnACudaStream(Rank& r) {
  void* cudaStream = nullptr;
  RANK_CHECK(22, fake.streamCreate(&cudaStream, 0) == 0);
  braidStream_t stream = nullptr;
  RANK_CHECK(23, braidStreamCreateFromCuda(r.comm, cudaStream, &stream) == braidSuccess);
  return gpuAgainstHostMemory(r, stream);
}

TEST_F(GpuJobs, GpuMemoryOnOneRankAndHostMemoryOnAnotherFailFastOnBoth) {
  RankSetup setup;
  setup.environment = {"BRAID_TIMEOUT=60"};
  for (RankBody body : {gpuAgainstHostMemoryOnTheCallersThread, gpuAgainstHostMemoryOnAStream,
                        gpuAgainstHostMemoryOnACudaStream}) {
    const auto start = std::chrono::steady_clock::now();
    expectEveryRankPassed(runRanks(2, body, setup));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  }
}

// Managed memory is staged through host memory, so device memory on one rank
// and managed memory on the other pair no better than device and host
// memory; the message must say what each rank passed, not call the managed
// memory host memory.
int deviceAgainstManagedMemory(Rank& r) {
  float* send = r.allocate(kCount);
  float* recv = r.allocate(2 * kCount);
  RANK_CHECK(10, send != nullptr && recv != nullptr);
  if (r.rank() == 1) fake.setRangeManaged(1);
  const braidResult_t result = braidAllGather(send, recv, kCount, braidFloat32, r.comm, nullptr);
  fake.setRangeManaged(0);
  const std::string message = braidGetLastError(nullptr);
  r.broken = true;
  RANK_CHECK(11, result == braidInvalidUsage || result == braidRemoteError);
  if (result != braidInvalidUsage) return 0;
  RANK_CHECK(12, message.find("host buffers") == std::string::npos);
  RANK_CHECK(13, message.find("rank 0 passed GPU device memory and this rank host or managed "
                              "memory") != std::string::npos ||
                     message.find("rank 1 passed host or managed memory and this rank GPU device "
                                  "memory") != std::string::npos);
  return 0;
}

TEST_F(GpuJobs, DeviceMemoryOnOneRankAndManagedMemoryOnAnotherAreNamedSo) {
  RankSetup setup;
  setup.environment = {"BRAID_TIMEOUT=60"};
  expectEveryRankPassed(runRanks(2, deviceAgainstManagedMemory, setup));
}

// Between hosts the same mix fails fast too, though no board is shared: the
// GPU job's messages say "GPU memory" in their check word, which the host
// call's do not, and the rank that receives one names both calls.
int gpuAgainstHostMemoryBetweenHosts(Rank& r) {
  std::string message;
  if (const int failed = allGatherOfMixedMemory(r, message)) return failed;
  if (message.empty()) return 0;
  RANK_CHECK(13, message.find("allgather(count=300000, float32, GPU memory)") != std::string::npos);
  RANK_CHECK(14, message.find("allgather(count=300000, float32)") != std::string::npos);
  return 0;
}

TEST_F(GpuJobs, GpuMemoryOnOneHostAndHostMemoryOnAnotherFailFastOnBoth) {
  RankSetup setup;
  setup.environment = {"BRAID_TIMEOUT=60"};
  setup.hostOf = ownHost;
  expectEveryRankPassed(runRanks(2, gpuAgainstHostMemoryBetweenHosts, setup));
}

// A rank whose buffers are on another GPU than its earlier GPU calls' fails
// that call (a rank uses one GPU), and its peers, which wait for its part,
// learn why at once rather than at BRAID_TIMEOUT.
int callOnASecondGpu(Rank& r) {
  float* send = r.allocate(kCount);
  float* recv = r.allocate(2 * kCount);
  RANK_CHECK(10, send != nullptr && recv != nullptr);
  RANK_CHECK(11, braidAllGather(send, recv, kCount, braidFloat32, r.comm, nullptr) == braidSuccess);
  if (r.rank() == 0) fake.setRangeDevice(1);
  const auto start = std::chrono::steady_clock::now();
  const braidResult_t result = braidAllGather(send, recv, kCount, braidFloat32, r.comm, nullptr);
  const auto took = std::chrono::steady_clock::now() - start;
  fake.setRangeDevice(0);
  const std::string message = braidGetLastError(nullptr);
  r.broken = true;
  // Rank 0 goes on for a while (a program that handles the error), so its
  // peer is not freed by its destroy.
  if (r.rank() == 0) std::this_thread::sleep_for(std::chrono::seconds(5));
  RANK_CHECK(12, result != braidSuccess);
  RANK_CHECK(13, took < std::chrono::seconds(3));
  RANK_CHECK(14, message.find("buffers on GPU 1 after calls on GPU 0") != std::string::npos);
  return 0;
}

TEST_F(GpuJobs, BuffersOnAnotherGpuFailTheCallOnEveryRankAtOnce) {
  RankSetup setup;
  setup.environment = {"BRAID_TIMEOUT=60"};
  expectEveryRankPassed(runRanks(2, callOnASecondGpu, setup));
}

}  // namespace
