// The harness of the GPU job tests (gpu_jobs_test.cc, gpu_group_jobs_test.cc):
// forked ranks of one communicator that share the stand-in CUDA driver's
// GPU 0, and the checked collectives they run on it. See gpu_jobs_test.cc
// for how the stand-in plays one GPU for several processes.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

namespace braid::testing::gpu_ranks {

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
  unsigned long (*ipcExports)();  // legacy memory handles exported (cuIpcGetMemHandle)
  void (*refuseIpcOpens)(int);
  void (*setGlobalCapture)(int);
  void (*holdMemoryLock)(int);
  unsigned long (*memoryLockRefusals)();
  unsigned long (*liveVmmMaps)();  // cuMem mappings: memory exported as descriptors, or imported
  void (*setRangeDevice)(int);     // the GPU the "GPU memory" is reported on
  void (*setRangeManaged)(int);    // whether the "GPU memory" is reported as managed

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
           find(deviceCopies, "fakeCudaDeviceToDeviceCopyCount") &&
           find(ipcExports, "fakeCudaIpcExportCount") &&
           find(refuseIpcOpens, "fakeCudaRefuseIpcOpens") &&
           find(setGlobalCapture, "fakeCudaSetGlobalCapture") &&
           find(holdMemoryLock, "fakeCudaHoldMemoryLockWhileStreamsWait") &&
           find(memoryLockRefusals, "fakeCudaMemoryLockRefusals") &&
           find(liveVmmMaps, "fakeCudaLiveVmmMaps") &&
           find(setRangeDevice, "fakeCudaSetRangeDevice") &&
           find(setRangeManaged, "fakeCudaSetRangeManaged");
  }
};

inline FakeDriver fake;

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
// The pieces a Send/Recv of `count` floats crosses in, as
// sendRecvPieceBytes (src/communicator.h) cuts it: pieces of a chunk, or of
// an eighth of the message where that is larger, in whole floats.
inline size_t sendRecvPieces(size_t count) {
  const size_t bytes = count * sizeof(float);
  size_t piece = std::max(kChunkBytes, (bytes + 7) / 8);
  piece -= piece % sizeof(float);
  return std::max<size_t>(1, (bytes + piece - 1) / piece);
}
// CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS
constexpr unsigned kInterprocessEvent = 0x6;

// Distinct, exact in a float (below 2^24) for rank, block < 3 and i < kCount.
inline float value(int rank, int block, size_t i) {
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

  // A send and a receive buffer of nranks() * kCount floats each; false if
  // the GPU is out of room.
  bool allocateBlocks(float*& send, float*& recv) {
    send = allocate(nranks_ * kCount);
    recv = allocate(nranks_ * kCount);
    return send != nullptr && recv != nullptr;
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

// RankSetup::hostOf for ranks that each play a host of their own (up to 3).
inline const char* ownHost(int rank) {
  static const char* const kHosts[] = {"host-a", "host-b", "host-c"};
  return kHosts[rank];
}

// How the ranks of a test are set up, besides the body.
struct RankSetup {
  // "NAME=value" entries put in each rank's environment before it joins.
  std::vector<std::string> environment;
  // The rank's BRAID_HOSTID, where ranks play several hosts; null: one host.
  const char* (*hostOf)(int rank) = nullptr;
};

class ForkedGpuRanks : public ::testing::Test {
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
    std::vector<std::string> environment = {
        "BRAID_CHUNK_BYTES=" + std::to_string(kChunkBytes),
        "BRAID_CUDA_IPC_SLOT_BYTES=" + std::to_string(kChunkBytes)};
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

// The fixture of the GPU job tests, which span two files
// (gpu_jobs_test.cc, gpu_jobs_mismatch_test.cc): gtest wants one class per
// suite.
class GpuJobs : public ForkedGpuRanks {};
inline void* ForkedGpuRanks::gpu_ = nullptr;

// Brackets calls: what the stand-in copied (and exported) since.
struct Copies {
  unsigned long hostDevice = fake.hostDeviceCopies();
  unsigned long device = fake.deviceCopies();
  unsigned long exports = fake.ipcExports();
  unsigned long hostDeviceSince() const { return fake.hostDeviceCopies() - hostDevice; }
  unsigned long deviceSince() const { return fake.deviceCopies() - device; }
  unsigned long exportsSince() const { return fake.ipcExports() - exports; }
  // Chunks this rank moved GPU to GPU: each a copy (into a peer's slot, or
  // out of its own, or out of a peer's buffer read in place); and the
  // allocations it exported for peers to read in place, each once
  // (BRAID_CUDA_IPC_DIRECT_BYTES).
  unsigned long movedSince() const { return deviceSince() + exportsSince(); }
};

// Whether messages go through the slots only (BRAID_CUDA_IPC_DIRECT_BYTES
// unset or 0 in the rank's environment), never read in place.
inline bool slotsOnly() {
  const char* v = std::getenv("BRAID_CUDA_IPC_DIRECT_BYTES");
  return v == nullptr || std::string(v) == "0";
}

// Whether this rank moved `blocks` blocks of kCount floats GPU to GPU since
// `copies`: through the slots, a copy for each slot-sized chunk. Read in
// place, a rank that only sends copies nothing, and exports each buffer
// once, not per call: the counts prove nothing there, and
// gpu_direct_reads_test.cc counts those calls exactly instead.
inline bool movedBlocks(const Copies& copies, unsigned long blocks = 1) {
  return !slotsOnly() || copies.movedSince() >= blocks * kChunksPerBlock;
}

// Every rank sends or receives at least a block in each of these calls,
// moved GPU to GPU; and the call stages nothing.
#define EXPECT_GPU_TO_GPU(step, copies)                \
  do {                                                 \
    RANK_CHECK(step, (copies).hostDeviceSince() == 0); \
    RANK_CHECK(step + 1, movedBlocks(copies));         \
  } while (0)

inline int broadcastFromTheLastRank(Rank& r, float* send, float* recv) {
  const int root = r.nranks() - 1;
  for (size_t i = 0; i < kCount; ++i) send[i] = value(r.rank(), 0, i);
  for (size_t i = 0; i < kCount; ++i) recv[i] = -1;
  RANK_CHECK(
      11, braidBroadcast(send, recv, kCount, braidFloat32, root, r.comm, nullptr) == braidSuccess);
  RANK_CHECK(12, firstWrong(recv, kCount, [&](size_t i) { return value(root, 0, i); }) == -1);
  return 0;
}

// AllGather: block b of recv is rank b's send (its block 0).
inline int allGatherChecked(Rank& r, float* send, float* recv) {
  const int n = r.nranks();
  for (size_t i = 0; i < n * kCount; ++i) recv[i] = -1;
  RANK_CHECK(20, braidAllGather(send, recv, kCount, braidFloat32, r.comm, nullptr) == braidSuccess);
  RANK_CHECK(21, firstWrong(recv, n * kCount, [&](size_t i) {
                   return value(static_cast<int>(i / kCount), 0, i % kCount);
                 }) == -1);
  return 0;
}

// AllToAll: block j of rank i's send lands in block i of rank j's recv.
inline int allToAllChecked(Rank& r, float* send, float* recv) {
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
inline int scatterFromTheLastRankChecked(Rank& r, float* send, float* recv) {
  const int n = r.nranks(), me = r.rank(), root = n - 1;
  for (size_t i = 0; i < n * kCount; ++i)
    send[i] = value(me, static_cast<int>(i / kCount), i % kCount);
  for (size_t i = 0; i < kCount; ++i) recv[i] = -1;
  RANK_CHECK(50, braidScatter(me == root ? send : nullptr, recv, kCount, braidFloat32, root, r.comm,
                              nullptr) == braidSuccess);
  RANK_CHECK(51, firstWrong(recv, kCount, [&](size_t i) { return value(root, me, i); }) == -1);
  return 0;
}

// The stand-in's calls that take the driver's memory lock (FAKE_LOCK_*):
// allocations, copies of pageable memory and mappings of peer memory.
constexpr int kEveryCallThatTakesTheLock = 1 | 2 | 4;

// A rank's blocks and a braid stream on a CUDA stream of its own; 0, or
// the step that failed.
struct OnACudaStream {
  float* send = nullptr;
  float* recv = nullptr;
  void* cudaStream = nullptr;
  braidStream_t stream = nullptr;
  unsigned long refusedBefore = 0;
  int setUp(Rank& r) {
    RANK_CHECK(10, r.allocateBlocks(send, recv));
    RANK_CHECK(11, fake.streamCreate(&cudaStream, 0) == 0);
    RANK_CHECK(12, braidStreamCreateFromCuda(r.comm, cudaStream, &stream) == braidSuccess);
    return 0;
  }
  // The stand-in holds the driver's memory lock for every call that takes
  // it, as an application thread in a copy queued after braid's calls does.
  void holdTheMemoryLock() {
    refusedBefore = fake.memoryLockRefusals();
    fake.holdMemoryLock(kEveryCallThatTakesTheLock);
  }
  // Once the CUDA stream got past every call: the lock released, no call
  // refused meanwhile, the braid stream destroyed. Steps `step` to `step+2`.
  int releaseTheMemoryLock(Rank& r, int step) {
    RANK_CHECK(step, fake.streamSynchronize(cudaStream) == 0);
    fake.holdMemoryLock(0);
    RANK_CHECK(step + 1, fake.memoryLockRefusals() == refusedBefore);
    RANK_CHECK(step + 2, braidStreamDestroy(stream) == braidSuccess);
    return 0;
  }
};

}  // namespace braid::testing::gpu_ranks
