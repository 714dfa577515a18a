// GPU jobs (src/gpu_path.h): collectives whose buffers are device memory of
// one GPU, among ranks that all share a host, move from GPU to GPU over
// cuda_ipc rather than through host memory. Each rank is a forked process
// with the stand-in CUDA driver (tests/unit/fake_libcuda*.c, path in
// FAKE_LIBCUDA) loaded, whose GPU 0 is one region mapped shared before the
// fork (fakeCudaShareArena): the same address in every rank, each rank
// allocating its buffers and slots from a part of its own, so that the
// peers' cuIpc handles open and their events are recorded in one process
// and waited for in another, as on one real GPU. The stand-in counts its
// copies by kind: device to device (the transport's) and host to or from
// device (staging), which tells the two routes apart, since both give the
// right bytes.
//
// A rank reports a failure through its exit status (the step that failed),
// and says why on stderr; the parent checks every rank's.
//
// Init runs the link probe as usual (its tags share the host connections
// with the cuda_ipc records), and ranks destroy the communicator right after
// their last call, while peers may still be handling its last records.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../unit/fake_libcuda_loader.h"
#include "braid.h"

namespace {

// The stand-in's entry points the test calls itself.
struct FakeDriver {
  int (*init)(unsigned);
  int (*primaryCtxRetain)(void**, int);
  int (*ctxSetCurrent)(void*);
  int (*memAlloc)(unsigned long long*, size_t);
  int (*streamCreate)(void**, unsigned);
  int (*streamSynchronize)(void*);
  int (*eventCreate)(void**, unsigned);
  int (*eventRecord)(void*, void*);
  int (*streamWaitEvent)(void*, void*, unsigned);
  int (*launchKernel)(void*, void (*)(void*), void*);
  void (*shareArena)(void*, size_t, size_t);
  void (*setWaitLimit)(unsigned);
  unsigned long (*hostDeviceCopies)();
  unsigned long (*deviceCopies)();

  bool load() {
    void* fake = braid::testing::openFakeLibcuda();
    if (fake == nullptr) return false;
    auto find = [&](auto& entry, const char* name) {
      return braid::testing::findEntry(fake, entry, name);
    };
    return find(init, "cuInit") && find(primaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
           find(ctxSetCurrent, "cuCtxSetCurrent") && find(memAlloc, "cuMemAlloc_v2") &&
           find(streamCreate, "cuStreamCreate") && find(streamSynchronize, "cuStreamSynchronize") &&
           find(eventCreate, "cuEventCreate") && find(eventRecord, "cuEventRecord") &&
           find(streamWaitEvent, "cuStreamWaitEvent") &&
           find(launchKernel, "fakeCudaLaunchKernel") && find(shareArena, "fakeCudaShareArena") &&
           find(setWaitLimit, "fakeCudaSetWaitLimit") &&
           find(hostDeviceCopies, "fakeCudaHostDeviceCopyCount") &&
           find(deviceCopies, "fakeCudaDeviceToDeviceCopyCount");
  }
};

FakeDriver fake;

constexpr int kMaxRanks = 3;
// A rank's part of the GPU: its buffers (two of at most 3 * kCount floats),
// the slots of its connections and its events.
constexpr size_t kPartBytes = size_t{64} << 20;
// Slots (and chunks) of 64 KiB: a block of kCount floats is 19 of them,
// more than a connection's 8 slots, so slots are reused and every reuse
// waits for the peer's event.
constexpr size_t kChunkBytes = 65536;
constexpr size_t kCount = 300000;
constexpr size_t kChunksPerBlock = (kCount * sizeof(float) + kChunkBytes - 1) / kChunkBytes;
// CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS
constexpr unsigned kInterprocessEvent = 0x6;

// Distinct, exact in a float (below 2^24) for rank, block < 3 and i < kCount.
float value(int rank, int block, size_t i) {
  return static_cast<float>(rank * 4000000 + block * 1000000 + static_cast<int>(i));
}

// What one forked rank has: its rank, GPU memory and communicator.
class Rank {
 public:
  Rank(int rank, int nranks) : rank_(rank), nranks_(nranks) {}

  // Says why step `step` failed, with braid's last message; returns `step`,
  // the exit status the parent sees.
  int fail(int step, const std::string& what) const {
    std::fprintf(stderr, "rank %d of %d, step %d: %s (braid: %s)\n", rank_, nranks_, step,
                 what.c_str(), braidGetLastError(nullptr));
    return step;
  }

  // `count` floats of this rank's part of the GPU, or nullptr.
  float* allocate(size_t count) {
    unsigned long long device = 0;
    if (fake.memAlloc(&device, count * sizeof(float)) != 0) return nullptr;
    return reinterpret_cast<float*>(static_cast<uintptr_t>(device));
  }

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  braidComm_t comm = nullptr;
  // Set by a body whose call failed as it expects: the connections are
  // gone, so the rank only destroys the communicator.
  bool broken = false;

 private:
  int rank_, nranks_;
};

// The first i where data[i] != expected(i), or -1.
template <typename Expected>
long firstWrong(const float* data, size_t count, Expected expected) {
  for (size_t i = 0; i < count; ++i)
    if (data[i] != expected(i)) return static_cast<long>(i);
  return -1;
}

#define RANK_CHECK(step, condition)                    \
  do {                                                 \
    if (!(condition)) return r.fail(step, #condition); \
  } while (0)

// The body of a rank: returns 0, or the step that failed (10 and up).
using RankBody = int (*)(Rank& r);

// How the ranks of a test are set up, besides the body.
struct RankSetup {
  // "NAME=value" entries put in each rank's environment before it joins.
  std::vector<std::string> environment;
  // The rank's BRAID_HOSTID, where ranks play several hosts; null: one host.
  const char* (*hostOf)(int rank) = nullptr;
};

class GpuJobs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(fake.load()) << "FAKE_LIBCUDA is not set or not the stand-in (meson sets it)";
    // Before fork, so that it is at one address in every rank.
    void* region = mmap(nullptr, kMaxRanks * kPartBytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(region, MAP_FAILED);
    gpu_ = region;
  }
  static void TearDownTestSuite() {
    if (gpu_ != nullptr) munmap(gpu_, kMaxRanks * kPartBytes);
    gpu_ = nullptr;
  }

  // Runs `body` on `nranks` forked ranks of one communicator, each with a
  // CUDA context current; the ranks' exit statuses, or -1 for a rank that
  // died or hung (a failure of the test already).
  static std::vector<int> runRanks(int nranks, RankBody body, const RankSetup& setup = {}) {
    std::vector<int> statuses(nranks, -1);
    braidUniqueId id;
    if (gpu_ == nullptr || braidGetUniqueId(&id) != braidSuccess) {
      ADD_FAILURE() << "no shared GPU, or no unique id: " << braidGetLastError(nullptr);
      return statuses;
    }
    std::vector<pid_t> children;
    for (int rank = 0; rank < nranks; ++rank) {
      const pid_t child = fork();
      if (child == 0) _exit(runRank(id, rank, nranks, body, setup));
      children.push_back(child);
    }
    // A rank that hangs is killed rather than left to hold the test until
    // meson's timeout, which would name no rank.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    std::vector<bool> ended(nranks, false);
    for (int rank = 0; rank < nranks; ++rank)
      if (children[rank] < 0) {
        ADD_FAILURE() << "fork failed for rank " << rank;
        ended[rank] = true;
      }
    for (int left = nranks; left > 0 && std::chrono::steady_clock::now() < deadline;) {
      left = 0;
      for (int rank = 0; rank < nranks; ++rank) {
        int status = 0;
        if (!ended[rank] && waitpid(children[rank], &status, WNOHANG) == children[rank]) {
          ended[rank] = true;
          if (WIFEXITED(status))
            statuses[rank] = WEXITSTATUS(status);
          else
            ADD_FAILURE() << "rank " << rank << " of " << nranks << " died of signal "
                          << WTERMSIG(status);
        }
        left += !ended[rank];
      }
      if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    for (int rank = 0; rank < nranks; ++rank)
      if (!ended[rank]) {
        kill(children[rank], SIGKILL);
        (void)waitpid(children[rank], nullptr, 0);
        ADD_FAILURE() << "rank " << rank << " of " << nranks << " hung (killed after 90 s)";
      }
    return statuses;
  }

  // Expects every rank to have returned 0.
  static void expectEveryRankPassed(const std::vector<int>& statuses) {
    for (size_t rank = 0; rank < statuses.size(); ++rank) {
      if (statuses[rank] == -1) continue;  // reported already
      EXPECT_EQ(statuses[rank], 0)
          << "rank " << rank << " of " << statuses.size() << " failed at step " << statuses[rank]
          << " (its stderr says why)";
    }
  }

 private:
  static int runRank(const braidUniqueId& id, int rank, int nranks, RankBody body,
                     const RankSetup& setup) {
    Rank r(rank, nranks);
    fake.shareArena(gpu_, nranks * kPartBytes, rank * kPartBytes);
    void* context = nullptr;
    RANK_CHECK(1, fake.init(0) == 0);
    RANK_CHECK(2, fake.primaryCtxRetain(&context, 0) == 0);
    RANK_CHECK(3, fake.ctxSetCurrent(context) == 0);
    std::vector<std::string> environment = {"BRAID_CHUNK_BYTES=" + std::to_string(kChunkBytes)};
    environment.insert(environment.end(), setup.environment.begin(), setup.environment.end());
    if (setup.hostOf != nullptr)
      environment.push_back(std::string("BRAID_HOSTID=") + setup.hostOf(rank));
    for (const std::string& entry : environment) RANK_CHECK(4, putenv(strdup(entry.c_str())) == 0);
    RANK_CHECK(5, braidCommInitRank(&r.comm, nranks, id, rank) == braidSuccess);
    const int outcome = body(r);
    if (outcome != 0 && !r.broken) return outcome;  // a failed check: left as it is
    RANK_CHECK(7, braidCommDestroy(r.comm) == braidSuccess);
    return outcome;
  }

  static void* gpu_;
};
void* GpuJobs::gpu_ = nullptr;

// Brackets calls: what the stand-in copied since.
struct Copies {
  unsigned long hostDevice = fake.hostDeviceCopies();
  unsigned long device = fake.deviceCopies();
  unsigned long hostDeviceSince() const { return fake.hostDeviceCopies() - hostDevice; }
  unsigned long deviceSince() const { return fake.deviceCopies() - device; }
};

// Every rank sends or receives at least a block in each of these calls, in
// slot-sized chunks, each one a device-to-device copy on this rank (into a
// peer's slot, or out of its own); and the call stages nothing.
#define EXPECT_GPU_TO_GPU(step, copies)                              \
  do {                                                               \
    RANK_CHECK(step, (copies).hostDeviceSince() == 0);               \
    RANK_CHECK(step + 1, (copies).deviceSince() >= kChunksPerBlock); \
  } while (0)

int broadcastFromTheLastRank(Rank& r, float* send, float* recv) {
  const int root = r.nranks() - 1;
  for (size_t i = 0; i < kCount; ++i) send[i] = value(r.rank(), 0, i);
  for (size_t i = 0; i < kCount; ++i) recv[i] = -1;
  RANK_CHECK(
      11, braidBroadcast(send, recv, kCount, braidFloat32, root, r.comm, nullptr) == braidSuccess);
  RANK_CHECK(12, firstWrong(recv, kCount, [&](size_t i) { return value(root, 0, i); }) == -1);
  return 0;
}

// AllGather: block b of recv is rank b's send (its block 0).
int allGatherChecked(Rank& r, float* send, float* recv) {
  const int n = r.nranks();
  for (size_t i = 0; i < n * kCount; ++i) recv[i] = -1;
  RANK_CHECK(20, braidAllGather(send, recv, kCount, braidFloat32, r.comm, nullptr) == braidSuccess);
  RANK_CHECK(21, firstWrong(recv, n * kCount, [&](size_t i) {
                   return value(static_cast<int>(i / kCount), 0, i % kCount);
                 }) == -1);
  return 0;
}

// AllToAll: block j of rank i's send lands in block i of rank j's recv.
int allToAllChecked(Rank& r, float* send, float* recv) {
  const int n = r.nranks(), me = r.rank();
  for (size_t i = 0; i < n * kCount; ++i)
    send[i] = value(me, static_cast<int>(i / kCount), i % kCount);
  for (size_t i = 0; i < n * kCount; ++i) recv[i] = -1;
  RANK_CHECK(30, braidAllToAll(send, recv, kCount, braidFloat32, r.comm, nullptr) == braidSuccess);
  RANK_CHECK(31, firstWrong(recv, n * kCount, [&](size_t i) {
                   return value(static_cast<int>(i / kCount), me, i % kCount);
                 }) == -1);
  return 0;
}

// Scatter from the last rank: rank j gets block j of its send.
int scatterFromTheLastRankChecked(Rank& r, float* send, float* recv) {
  const int n = r.nranks(), me = r.rank(), root = n - 1;
  for (size_t i = 0; i < n * kCount; ++i)
    send[i] = value(me, static_cast<int>(i / kCount), i % kCount);
  for (size_t i = 0; i < kCount; ++i) recv[i] = -1;
  RANK_CHECK(50, braidScatter(me == root ? send : nullptr, recv, kCount, braidFloat32, root, r.comm,
                              nullptr) == braidSuccess);
  RANK_CHECK(51, firstWrong(recv, kCount, [&](size_t i) { return value(root, me, i); }) == -1);
  return 0;
}

int copyCollectives(Rank& r) {
  const int n = r.nranks(), me = r.rank(), root = n - 1;
  float* send = r.allocate(n * kCount);
  float* recv = r.allocate(n * kCount);
  RANK_CHECK(10, send != nullptr && recv != nullptr);

  {
    Copies copies;
    if (const int failed = broadcastFromTheLastRank(r, send, recv)) return failed;
    EXPECT_GPU_TO_GPU(13, copies);
  }

  {
    Copies copies;
    if (const int failed = allGatherChecked(r, send, recv)) return failed;
    EXPECT_GPU_TO_GPU(22, copies);
  }
  {
    Copies copies;
    if (const int failed = allToAllChecked(r, send, recv)) return failed;
    EXPECT_GPU_TO_GPU(32, copies);
  }

  // Gather to the last rank: block b of its recv is rank b's send; the
  // others' recv stays as it was.
  for (size_t i = 0; i < kCount; ++i) send[i] = value(me, 0, i);
  for (size_t i = 0; i < n * kCount; ++i) recv[i] = -1;
  {
    Copies copies;
    RANK_CHECK(40, braidGather(send, me == root ? recv : nullptr, kCount, braidFloat32, root,
                               r.comm, nullptr) == braidSuccess);
    if (me == root)
      RANK_CHECK(41, firstWrong(recv, n * kCount, [&](size_t i) {
                       return value(static_cast<int>(i / kCount), 0, i % kCount);
                     }) == -1);
    else
      RANK_CHECK(42, firstWrong(recv, n * kCount, [](size_t) { return -1.0f; }) == -1);
    EXPECT_GPU_TO_GPU(43, copies);
  }

  {
    Copies copies;
    if (const int failed = scatterFromTheLastRankChecked(r, send, recv)) return failed;
    EXPECT_GPU_TO_GPU(52, copies);
  }
  return 0;
}

TEST_F(GpuJobs, CopyCollectivesMoveGpuToGpuAmongTwoRanks) {
  expectEveryRankPassed(runRanks(2, copyCollectives));
}

TEST_F(GpuJobs, CopyCollectivesMoveGpuToGpuAmongThreeRanks) {
  expectEveryRankPassed(runRanks(3, copyCollectives));
}

// With BRAID_GPU_STAGING=whole and BRAID_CUDA_IPC=0 the same Broadcast is
// staged whole through host memory: only host<->device copies, exactly
// those staging makes (the root's send over, and every rank's recv over and
// back), and none from GPU to GPU.
int stagedWholeBroadcast(Rank& r) {
  float* send = r.allocate(kCount);
  float* recv = r.allocate(kCount);
  RANK_CHECK(10, send != nullptr && recv != nullptr);
  Copies copies;
  if (const int failed = broadcastFromTheLastRank(r, send, recv)) return failed;
  const bool root = r.rank() == r.nranks() - 1;
  RANK_CHECK(13, copies.hostDeviceSince() == (root ? 3u : 2u));
  RANK_CHECK(14, copies.deviceSince() == 0);
  return 0;
}

TEST_F(GpuJobs, WithWholeStagingBroadcastIsStagedWhole) {
  RankSetup setup;
  setup.environment = {"BRAID_CUDA_IPC=0", "BRAID_GPU_STAGING=whole"};
  expectEveryRankPassed(runRanks(2, stagedWholeBroadcast, setup));
}

// Between hosts (each rank its own BRAID_HOSTID) the copy collectives are
// GPU jobs over the host transport: every message goes through pinned host
// memory in pieces of a chunk, so many more copies than whole staging's 2
// or 3, and none from GPU to GPU in a Broadcast but the root's own.
const char* ownHost(int rank) {
  static const char* const kHosts[] = {"host-a", "host-b", "host-c"};
  return kHosts[rank];
}

int copyCollectivesBetweenHosts(Rank& r) {
  const int n = r.nranks();
  float* send = r.allocate(n * kCount);
  float* recv = r.allocate(n * kCount);
  RANK_CHECK(10, send != nullptr && recv != nullptr);
  {
    Copies copies;
    if (const int failed = broadcastFromTheLastRank(r, send, recv)) return failed;
    RANK_CHECK(13, copies.hostDeviceSince() >= kChunksPerBlock);
    RANK_CHECK(14, copies.deviceSince() <= 1);
  }
  if (const int failed = allGatherChecked(r, send, recv)) return failed;
  {
    // AllToAll sends each peer its block as one message, which the
    // communicator splits into chunk-sized pieces, each copied on its own.
    Copies copies;
    if (const int failed = allToAllChecked(r, send, recv)) return failed;
    RANK_CHECK(32, copies.hostDeviceSince() >= 2 * kChunksPerBlock);  // out and in
  }
  return scatterFromTheLastRankChecked(r, send, recv);
}

TEST_F(GpuJobs, CopyCollectivesGoThroughPinnedMemoryBetweenHosts) {
  RankSetup setup;
  setup.hostOf = ownHost;
  expectEveryRankPassed(runRanks(2, copyCollectivesBetweenHosts, setup));
}

// Ranks 0 and 1 share a host, rank 2 has its own: in one call, 0 and 1
// move GPU to GPU over cuda_ipc and reach 2 through pinned memory.
const char* twoHosts(int rank) {
  return rank < 2 ? "host-a" : "host-b";
}

int copyCollectivesOnTwoHosts(Rank& r) {
  const int n = r.nranks(), me = r.rank();
  float* send = r.allocate(n * kCount);
  float* recv = r.allocate(n * kCount);
  RANK_CHECK(10, send != nullptr && recv != nullptr);
  Copies copies;
  if (const int failed = allToAllChecked(r, send, recv)) return failed;
  // Every rank sends a block to rank 2 or receives one from it (or both).
  RANK_CHECK(32, copies.hostDeviceSince() >= 1);
  // Ranks 0 and 1 send each other a block in slot-sized chunks.
  if (me < 2) RANK_CHECK(33, copies.deviceSince() >= kChunksPerBlock);
  return broadcastFromTheLastRank(r, send, recv);
}

TEST_F(GpuJobs, RanksOfOneHostUseCudaIpcAndReachTheOtherHostThroughPinnedMemory) {
  RankSetup setup;
  setup.hostOf = twoHosts;
  expectEveryRankPassed(runRanks(3, copyCollectivesOnTwoHosts, setup));
}

// AllReduce on GPU memory reduces with braid's CUDA kernels (src/cuda),
// launched through the CUDA runtime linked into libbraid. That runtime
// looks the driver up in the loaded libcuda.so.1, the stand-in, and asks it
// first for cuGetProcAddress_v2 (or cuGetProcAddress), which the stand-in
// does not have; so the first launch fails with cudaErrorInsufficientDriver.
// The call must then fail on every rank, promptly, and say why: the rank
// whose launch failed first returns braidUnhandledCudaError with CUDA's
// message; the rest either fail their own launch alike, or learn of the
// failure first from that rank, whose abort ends their connections
// (braidRemoteError, CUDA's message relayed). Which, is a race; at least one
// rank's own launch fails.
constexpr const char* kRuntimeRefusesTheStandIn =
    "CUDA driver version is insufficient for CUDA runtime version";
constexpr int kFailedItsLaunch = 0, kLearnedFromAPeer = 100;

int allReduceFailsForWantOfKernels(Rank& r) {
  float* send = r.allocate(kCount);
  float* recv = r.allocate(kCount);
  RANK_CHECK(10, send != nullptr && recv != nullptr);
  for (size_t i = 0; i < kCount; ++i) send[i] = value(r.rank(), 0, i);
  Copies copies;
  const braidResult_t result =
      braidAllReduce(send, recv, kCount, braidFloat32, braidSum, r.comm, nullptr);
  // The stand-in ran the kernels after all: then the sum must be right, and
  // this test must expect that instead.
  RANK_CHECK(11, result != braidSuccess);
  const std::string message = braidGetLastError(nullptr);
  RANK_CHECK(12, result == braidUnhandledCudaError || result == braidRemoteError);
  RANK_CHECK(13, message.find("braidAllReduce") != std::string::npos);
  RANK_CHECK(14, message.find(kRuntimeRefusesTheStandIn) != std::string::npos);
  RANK_CHECK(15, copies.hostDeviceSince() == 0);  // it never fell back to staging
  r.broken = true;
  return result == braidUnhandledCudaError ? kFailedItsLaunch : kLearnedFromAPeer;
}

void expectAllReduceFailedEverywhere(const std::vector<int>& statuses) {
  int launchesFailed = 0;
  for (size_t rank = 0; rank < statuses.size(); ++rank) {
    if (statuses[rank] == -1) continue;
    EXPECT_TRUE(statuses[rank] == kFailedItsLaunch || statuses[rank] == kLearnedFromAPeer)
        << "rank " << rank << " of " << statuses.size() << " failed at step " << statuses[rank]
        << " (its stderr says why)";
    launchesFailed += statuses[rank] == kFailedItsLaunch;
  }
  EXPECT_GE(launchesFailed, 1) << "no rank reported the CUDA error as its own";
}

TEST_F(GpuJobs, AllReduceFailsOnEveryRankWithCudasErrorAmongTwoRanks) {
  expectAllReduceFailedEverywhere(runRanks(2, allReduceFailsForWantOfKernels));
}

TEST_F(GpuJobs, AllReduceFailsOnEveryRankWithCudasErrorAmongThreeRanks) {
  expectAllReduceFailedEverywhere(runRanks(3, allReduceFailsForWantOfKernels));
}

// The stand-in itself: a wait for an event of the shared arena that no
// process records polls, and gives up by failing its stream instead of
// hanging, so that a rank whose peer never records fails the test.
struct Gate {
  std::atomic<bool> open{false};
  static void run(void* self) {
    auto* g = static_cast<Gate*>(self);
    while (!g->open.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
};

int aWaitNobodyCompletesGivesUp(Rank& r) {
  void *recorder = nullptr, *waiter = nullptr, *event = nullptr;
  RANK_CHECK(10, fake.streamCreate(&recorder, 0) == 0 && fake.streamCreate(&waiter, 0) == 0);
  RANK_CHECK(11, fake.eventCreate(&event, kInterprocessEvent) == 0);
  Gate gate;
  RANK_CHECK(12, fake.launchKernel(recorder, &Gate::run, &gate) == 0);
  RANK_CHECK(13, fake.eventRecord(event, recorder) == 0);
  fake.setWaitLimit(200);
  RANK_CHECK(14, fake.streamWaitEvent(waiter, event, 0) == 0);
  const auto start = std::chrono::steady_clock::now();
  constexpr int kIllegalAddress = 700;  // the stand-in's failed stream
  RANK_CHECK(15, fake.streamSynchronize(waiter) == kIllegalAddress);
  RANK_CHECK(16, std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  gate.open.store(true);
  RANK_CHECK(17, fake.streamSynchronize(recorder) == 0);
  return 0;
}

TEST_F(GpuJobs, TheStandInGivesUpAWaitNobodyCompletes) {
  expectEveryRankPassed(runRanks(1, aWaitNobodyCompletesGivesUp));
}

// Bugs once found here, each with its test.
int broadcastOnly(Rank& r) {
  float* send = r.allocate(kCount);
  float* recv = r.allocate(kCount);
  RANK_CHECK(10, send != nullptr && recv != nullptr);
  return broadcastFromTheLastRank(r, send, recv);
}

// The link probe at init once used the cuda_ipc records' tag channel, and
// the host connection then refused the handshake as overtaken ("rank N
// moved past this message").
TEST_F(GpuJobs, AfterTheLinkProbeTheHandshakeIsNotOvertaken) {
  expectEveryRankPassed(runRanks(2, broadcastOnly));
}

// A Scatter, after a Broadcast that set the connections up.
int scatterLast(Rank& r) {
  const int n = r.nranks();
  float* send = r.allocate(n * kCount);
  float* recv = r.allocate(n * kCount);
  RANK_CHECK(10, send != nullptr && recv != nullptr);
  if (const int failed = broadcastFromTheLastRank(r, send, recv)) return failed;
  return scatterFromTheLastRankChecked(r, send, recv);
}

// A peer that handled the goodbye of a rank which destroyed the communicator
// right after its call once failed its receives before handling the chunk
// records that arrived ahead of the goodbye. It failed within a few tries.
TEST_F(GpuJobs, ARankMayDestroyRightAfterItsCall) {
  for (int attempt = 0; attempt < 10 && !HasFailure(); ++attempt)
    expectEveryRankPassed(runRanks(3, scatterLast));
}

}  // namespace
