// GPU buffers given to the C ABI. A CUDA build (BRAID_TEST_STAGING) stages
// them through host memory for calls with stream NULL (inside a group too)
// and on a braid stream outside a group, and refuses them elsewhere; a build without CUDA refuses
// them everywhere, with braidNotSupported and a message naming the argument and the device, never
// reading them as host memory. The process loads a stand-in CUDA driver
// (tests/unit/fake_libcuda.c, path in FAKE_LIBCUDA) that reports a range of
// ordinary host memory as GPU memory and copies with memcpy, so a call that
// read the "GPU" buffer directly would quietly succeed: the tests count the
// driver's copies.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "braid.h"
#include "expect_braid.h"

namespace {

using SetDeviceRange = void (*)(void*, size_t, int, int);
using Counter = unsigned long (*)();
using Depth = int (*)();
using SetFlag = void (*)(int);
using Init = int (*)(unsigned);
using RetainPrimary = int (*)(void**, int);
using SetCurrent = int (*)(void*);

template <typename F>
F driverEntry(void* driver, const char* name) {
  return reinterpret_cast<F>(dlsym(driver, name));
}

// `call` returns braidNotSupported and its message names every one of `parts`.
#define EXPECT_REFUSED(call, ...) EXPECT_BRAID_ERROR(call, braidNotSupported, __VA_ARGS__)

class GpuBuffers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* path = std::getenv("FAKE_LIBCUDA");
    ASSERT_NE(path, nullptr) << "FAKE_LIBCUDA is not set (meson sets it)";
    // A first call before the driver appears, as in a job that initializes
    // CUDA after its communicator.
    braidUniqueId id;
    EXPECT_BRAID_OK(braidGetUniqueId(&id));
    EXPECT_BRAID_OK(braidCommInitRank(&comm_, 1, id, 0));
    ASSERT_NE(comm_, nullptr);
    float x = 1, y = 0;
    EXPECT_BRAID_OK(braidAllReduce(&x, &y, 1, braidFloat32, braidSum, comm_, nullptr));

    void* fake = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(fake, nullptr) << dlerror();
    setDeviceRange_ = driverEntry<SetDeviceRange>(fake, "fakeCudaSetDeviceRange");
    copies_ = driverEntry<Counter>(fake, "fakeCudaCopyCount");
    contextDepth_ = driverEntry<Depth>(fake, "fakeCudaContextDepth");
    failCopies_ = driverEntry<SetFlag>(fake, "fakeCudaFailCopies");
    failPointerQueries_ = driverEntry<SetFlag>(fake, "fakeCudaFailPointerQueries");
    withoutContext_ = driverEntry<SetFlag>(fake, "fakeCudaRangeWithoutContext");
    init_ = driverEntry<Init>(fake, "cuInit");
    retainPrimary_ = driverEntry<RetainPrimary>(fake, "cuDevicePrimaryCtxRetain");
    setCurrent_ = driverEntry<SetCurrent>(fake, "cuCtxSetCurrent");
    ASSERT_TRUE(setDeviceRange_ && copies_ && contextDepth_ && failCopies_ && failPointerQueries_ &&
                withoutContext_ && init_ && retainPrimary_ && setCurrent_)
        << dlerror();
    // braid looks for a newly loaded driver at most once a millisecond.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  static void TearDownTestSuite() {
    if (setDeviceRange_) setDeviceRange_(nullptr, 0, 0, 0);
    EXPECT_BRAID_OK(braidCommDestroy(comm_));
    comm_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(comm_, nullptr);
    ASSERT_NE(setDeviceRange_, nullptr);
    setDeviceRange_(gpu_, sizeof(gpu_), 3, 0);
  }
  void TearDown() override {
    failCopies_(0);
    failPointerQueries_(0);
    withoutContext_(0);
    setDeviceRange_(nullptr, 0, 0, 0);
    EXPECT_EQ(contextDepth_(), 0) << "a context was left pushed";
  }

  static braidComm_t comm_;
  static SetDeviceRange setDeviceRange_;
  static Counter copies_;
  static Depth contextDepth_;
  static SetFlag failCopies_;
  static SetFlag failPointerQueries_;
  static SetFlag withoutContext_;
  static Init init_;
  static RetainPrimary retainPrimary_;
  static SetCurrent setCurrent_;
  float gpu_[64] = {};  // "device memory of GPU 3" for the driver
  float host_[64] = {};
};
braidComm_t GpuBuffers::comm_ = nullptr;
SetDeviceRange GpuBuffers::setDeviceRange_ = nullptr;
Counter GpuBuffers::copies_ = nullptr;
Depth GpuBuffers::contextDepth_ = nullptr;
SetFlag GpuBuffers::failCopies_ = nullptr;
SetFlag GpuBuffers::failPointerQueries_ = nullptr;
SetFlag GpuBuffers::withoutContext_ = nullptr;
Init GpuBuffers::init_ = nullptr;
RetainPrimary GpuBuffers::retainPrimary_ = nullptr;
SetCurrent GpuBuffers::setCurrent_ = nullptr;

void fill(float* data, int n, float first) {
  for (int i = 0; i < n; ++i) data[i] = first + static_cast<float>(i);
}

#ifdef BRAID_TEST_STAGING

TEST_F(GpuBuffers, AllReduceStagesEitherBuffer) {
  fill(gpu_, 64, 1);
  const unsigned long before = copies_();
  EXPECT_BRAID_OK(braidAllReduce(gpu_, host_, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(host_[0], 1.0f);
  EXPECT_EQ(host_[63], 64.0f);
  EXPECT_EQ(copies_() - before, 1u);  // sendbuff over; nothing back

  fill(host_, 64, 100);
  EXPECT_BRAID_OK(braidAllReduce(host_, gpu_, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(gpu_[0], 100.0f);
  EXPECT_EQ(gpu_[63], 163.0f);
  EXPECT_EQ(copies_() - before, 3u);  // recvbuff over and back

  // In place: one buffer over and back.
  EXPECT_BRAID_OK(braidAllReduce(gpu_, gpu_, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(gpu_[5], 105.0f);
  EXPECT_EQ(copies_() - before, 5u);
  // Part of the allocation, in place: only that part moves, and the rest
  // stays as it was.
  EXPECT_BRAID_OK(braidAllReduce(gpu_ + 32, gpu_ + 32, 16, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(gpu_[31], 131.0f);
  EXPECT_EQ(gpu_[32], 132.0f);
  EXPECT_EQ(gpu_[48], 148.0f);
}

// Memory of cuMemCreate (PyTorch's expandable segments) or of a memory pool
// (cudaMallocAsync) belongs to no context: it is staged in the primary
// context of its GPU. Before, entering the NULL context failed every call.
TEST_F(GpuBuffers, MemoryOfNoContextIsStagedInThePrimaryContextOfItsGpu) {
  ASSERT_EQ(init_(0), 0);  // the program initialized CUDA to allocate it
  setDeviceRange_(gpu_, sizeof(gpu_), 0, 0);
  withoutContext_(1);
  fill(gpu_, 64, 1);
  const unsigned long before = copies_();
  EXPECT_BRAID_OK(braidAllReduce(gpu_, gpu_, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(copies_() - before, 2u);  // over and back
  EXPECT_EQ(gpu_[0], 1.0f);
  EXPECT_EQ(gpu_[63], 64.0f);
}

// Managed memory of a memory pool may name no GPU (the driver says -1, the
// CPU) and belong to no context: it is staged in the calling thread's
// current context, and refused, saying why, where the thread has none.
// Before, it was staged in the primary context of "GPU -1", which failed.
TEST_F(GpuBuffers, ManagedMemoryOfNoGpuIsStagedInTheCurrentContext) {
  ASSERT_EQ(init_(0), 0);
  setDeviceRange_(gpu_, sizeof(gpu_), -1, 1);
  withoutContext_(1);
  fill(gpu_, 64, 1);
  EXPECT_BRAID_ERROR(braidAllReduce(gpu_, host_, 64, braidFloat32, braidSum, comm_, nullptr),
                     braidInvalidArgument, "staging sendbuff", "names no GPU", "cudaSetDevice");
  void* context = nullptr;
  ASSERT_EQ(retainPrimary_(&context, 0), 0);
  ASSERT_EQ(setCurrent_(context), 0);
  const unsigned long before = copies_();
  EXPECT_BRAID_OK(braidAllReduce(gpu_, host_, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(host_[63], 64.0f);
  EXPECT_EQ(copies_() - before, 1u);
  ASSERT_EQ(setCurrent_(nullptr), 0);
}

TEST_F(GpuBuffers, ManagedMemoryIsStagedToo) {
  setDeviceRange_(gpu_, sizeof(gpu_), 1, 1);
  fill(gpu_, 64, 7);
  const unsigned long before = copies_();
  EXPECT_BRAID_OK(braidAllReduce(gpu_, host_, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(host_[63], 70.0f);
  EXPECT_EQ(copies_() - before, 1u);
}

// With one rank every collective hands its input back, so each result is
// the staged input, through the driver.
TEST_F(GpuBuffers, EveryCollectiveStagesTheBuffersItUses) {
  fill(gpu_, 64, 1);
  const unsigned long before = copies_();
  EXPECT_BRAID_OK(braidBroadcast(gpu_, host_, 64, braidFloat32, 0, comm_, nullptr));
  EXPECT_EQ(host_[63], 64.0f);
  fill(host_, 64, 200);
  EXPECT_BRAID_OK(braidReduce(host_, gpu_, 64, braidFloat32, braidSum, 0, comm_, nullptr));
  EXPECT_EQ(gpu_[63], 263.0f);
  fill(gpu_, 64, 1);
  EXPECT_BRAID_OK(braidAllGather(gpu_, host_, 64, braidFloat32, comm_, nullptr));
  EXPECT_EQ(host_[10], 11.0f);
  fill(host_, 64, 300);
  EXPECT_BRAID_OK(braidReduceScatter(host_, gpu_, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(gpu_[10], 310.0f);
  fill(host_, 64, 400);
  EXPECT_BRAID_OK(braidAllToAll(host_, gpu_, 64, braidFloat32, comm_, nullptr));
  EXPECT_EQ(gpu_[10], 410.0f);
  EXPECT_BRAID_OK(braidGather(gpu_, host_, 64, braidFloat32, 0, comm_, nullptr));
  EXPECT_EQ(host_[10], 410.0f);
  fill(gpu_, 64, 500);
  EXPECT_BRAID_OK(braidScatter(gpu_, host_, 64, braidFloat32, 0, comm_, nullptr));
  EXPECT_EQ(host_[10], 510.0f);
  // 1 copy for each GPU send buffer (4) and 2 for each GPU recv buffer (3).
  EXPECT_EQ(copies_() - before, 10u);
}

// Two processes, each with its own "GPU" buffer: Send/Recv and AllReduce
// between GPU buffers, through the host path and the shared-memory
// transport. Each rank reports failures through its exit status.
int rankOfTwo(const braidUniqueId& id, int rank, SetDeviceRange setDeviceRange, Counter copies) {
  const unsigned long before = copies();
  float gpu[64];
  setDeviceRange(gpu, sizeof(gpu), rank, 0);
  braidComm_t comm = nullptr;
  if (braidCommInitRank(&comm, 2, id, rank) != braidSuccess) return 10;
  fill(gpu, 64, static_cast<float>(100 * rank));
  if (rank == 0 && braidSend(gpu, 64, braidFloat32, 1, comm, nullptr) != braidSuccess) return 11;
  if (rank == 1) {
    if (braidRecv(gpu, 64, braidFloat32, 0, comm, nullptr) != braidSuccess) return 12;
    if (gpu[0] != 0.0f || gpu[63] != 63.0f) return 13;  // rank 0's values
  }
  fill(gpu, 64, static_cast<float>(100 * rank));
  if (braidAllReduce(gpu, gpu, 64, braidFloat32, braidSum, comm, nullptr) != braidSuccess)
    return 14;
  if (gpu[0] != 100.0f || gpu[63] != 226.0f) return 15;  // (0 + i) + (100 + i)
  // Send: 1 over; Recv: 2; AllReduce in place: 2.
  if (copies() - before != (rank == 0 ? 3u : 4u)) return 16;
  // Each sends its first half to the other and receives into its second:
  // only a group lets both send first.
  fill(gpu, 32, static_cast<float>(1000 * rank));
  if (braidGroupStart() != braidSuccess) return 18;
  if (braidSend(gpu, 32, braidFloat32, 1 - rank, comm, nullptr) != braidSuccess) return 19;
  if (braidRecv(gpu + 32, 32, braidFloat32, 1 - rank, comm, nullptr) != braidSuccess) return 20;
  if (braidGroupEnd() != braidSuccess) return 21;
  if (gpu[32] != 1000.0f * (1 - rank) || gpu[63] != 1000.0f * (1 - rank) + 31) return 22;
  if (braidCommDestroy(comm) != braidSuccess) return 17;
  setDeviceRange(nullptr, 0, 0, 0);
  return 0;
}

TEST_F(GpuBuffers, TwoProcessesMoveGpuBuffers) {
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess) << braidGetLastError(nullptr);
  setDeviceRange_(nullptr, 0, 0, 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(rankOfTwo(id, 1, setDeviceRange_, copies_));
  const int mine = rankOfTwo(id, 0, setDeviceRange_, copies_);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(mine, 0) << "rank 0 failed at step " << mine << ": " << braidGetLastError(nullptr);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "rank 1 failed at step " << WEXITSTATUS(status);
}

// On a host stream, the stream's thread stages them, in the stream's order.
TEST_F(GpuBuffers, OnAHostStreamTheyAreStagedInTheStreamsOrder) {
  braidStream_t stream = nullptr;
  ASSERT_EQ(braidStreamCreate(comm_, &stream), braidSuccess) << braidGetLastError(nullptr);
  fill(gpu_, 64, 1);
  fill(host_, 64, 0);
  const unsigned long before = copies_();
  EXPECT_BRAID_OK(braidAllReduce(gpu_, host_, 64, braidFloat32, braidSum, comm_, stream));
  // In place on the GPU buffer, after the call above read it.
  float other[64];
  fill(other, 64, 50);
  EXPECT_BRAID_OK(braidAllReduce(other, gpu_, 64, braidFloat32, braidSum, comm_, stream));
  EXPECT_BRAID_OK(braidStreamSynchronize(stream));
  EXPECT_EQ(host_[0], 1.0f);
  EXPECT_EQ(host_[63], 64.0f);
  EXPECT_EQ(gpu_[0], 50.0f);
  EXPECT_EQ(gpu_[63], 113.0f);
  EXPECT_EQ(copies_() - before, 3u);  // sendbuff over; recvbuff over and back
  EXPECT_BRAID_OK(braidStreamDestroy(stream));
}

// In a group (stream NULL) they are staged when the group ends, around the
// whole group: a self Send of one GPU buffer and its Recv into another,
// and an AllReduce in place on a third.
TEST_F(GpuBuffers, InAGroupTheyAreStagedAroundTheGroup) {
  float* source = gpu_;
  float* target = gpu_ + 16;
  float* reduced = gpu_ + 32;
  fill(target, 16, -100);
  fill(reduced, 16, 100);
  const unsigned long before = copies_();
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(braidSend(source, 16, braidFloat32, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidRecv(target, 16, braidFloat32, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidAllReduce(reduced, reduced, 16, braidFloat32, braidSum, comm_, nullptr));
  // Nothing is read before the group ends: it sends what the GPU holds then.
  fill(source, 16, 7);
  EXPECT_EQ(copies_() - before, 0u);
  EXPECT_BRAID_OK(braidGroupEnd());
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(target[i], 7.0f + static_cast<float>(i)) << i;
    EXPECT_EQ(reduced[i], 100.0f + static_cast<float>(i)) << i;
  }
  // Send: over; Recv: over and back; AllReduce in place: over and back.
  EXPECT_EQ(copies_() - before, 5u);
}

// On a braid stream inside a group they are staged around the group, on
// the stream's thread, when the stream reaches the group.
TEST_F(GpuBuffers, InAGroupOnAHostStreamTheyAreStagedOnTheStream) {
  braidStream_t stream = nullptr;
  ASSERT_EQ(braidStreamCreate(comm_, &stream), braidSuccess) << braidGetLastError(nullptr);
  float* source = gpu_;
  float* target = gpu_ + 16;
  fill(source, 16, 9);
  fill(target, 16, -100);
  const unsigned long before = copies_();
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(braidSend(source, 16, braidFloat32, 0, comm_, stream));
  EXPECT_BRAID_OK(braidRecv(target, 16, braidFloat32, 0, comm_, stream));
  EXPECT_BRAID_OK(braidAllReduce(host_, gpu_ + 32, 16, braidFloat32, braidSum, comm_, stream));
  EXPECT_BRAID_OK(braidGroupEnd());
  EXPECT_BRAID_OK(braidStreamSynchronize(stream));
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(target[i], 9.0f + static_cast<float>(i)) << i;
    EXPECT_EQ(gpu_[32 + i], host_[i]) << i;
  }
  // Send: over; Recv: over and back; AllReduce: its recvbuff over and back.
  EXPECT_EQ(copies_() - before, 5u);
  EXPECT_BRAID_OK(braidStreamDestroy(stream));
}

TEST_F(GpuBuffers, AFailedCopyIsACudaErrorWithTheDriversMessage) {
  failCopies_(1);
  fill(host_, 64, 0);
  EXPECT_BRAID_ERROR(braidAllReduce(gpu_, host_, 64, braidFloat32, braidSum, comm_, nullptr),
                     braidUnhandledCudaError, "braidAllReduce", "sendbuff", "illegal", "700");
  EXPECT_EQ(host_[63], 63.0f);  // the call did not run
}

// A buffer that runs past the end of its GPU allocation (a count too large
// for it) is refused by name, rather than read and written past its end
// (or, in place, taken for host memory where the other end lies past it).
TEST_F(GpuBuffers, ABufferPastTheEndOfItsAllocationIsRefused) {
  std::vector<float> host(128);  // not next to gpu_, as host_ is
  const unsigned long before = copies_();
  EXPECT_BRAID_ERROR(braidAllReduce(gpu_, gpu_, 65, braidFloat32, braidSum, comm_, nullptr),
                     braidInvalidArgument, "braidAllReduce", "sendbuff");
  EXPECT_BRAID_ERROR(
      braidAllReduce(gpu_ + 40, host.data(), 25, braidFloat32, braidSum, comm_, nullptr),
      braidInvalidArgument, "braidAllReduce", "past the end");
  EXPECT_BRAID_ERROR(
      braidAllReduce(host.data(), gpu_ + 60, 8, braidFloat32, braidSum, comm_, nullptr),
      braidInvalidArgument, "braidAllReduce", "recvbuff");
  EXPECT_BRAID_ERROR(braidBroadcast(gpu_ + 63, host.data(), 2, braidFloat32, 0, comm_, nullptr),
                     braidInvalidArgument, "braidBroadcast", "sendbuff");
  EXPECT_EQ(copies_(), before);  // nothing was read
  // Up to the end is fine.
  EXPECT_BRAID_OK(braidAllReduce(gpu_, gpu_ + 32, 32, braidFloat32, braidSum, comm_, nullptr));
}

#else  // a build without CUDA refuses them

TEST_F(GpuBuffers, AllReduceRefusesEitherBuffer) {
  EXPECT_REFUSED(braidAllReduce(gpu_, host_, 64, braidFloat32, braidSum, comm_, nullptr),
                 "braidAllReduce", "sendbuff is GPU device memory (device 3)", "host memory only");
  EXPECT_REFUSED(braidAllReduce(host_, gpu_, 64, braidFloat32, braidSum, comm_, nullptr),
                 "braidAllReduce", "recvbuff is GPU device memory (device 3)");
  EXPECT_REFUSED(braidAllReduce(gpu_, gpu_, 64, braidFloat32, braidSum, comm_, nullptr),
                 "braidAllReduce", "device 3");
  // A pointer into the middle of the allocation is GPU memory too.
  EXPECT_REFUSED(braidAllReduce(host_, gpu_ + 32, 32, braidFloat32, braidSum, comm_, nullptr),
                 "recvbuff", "device 3");
  EXPECT_EQ(copies_(), 0u);
}

TEST_F(GpuBuffers, ManagedMemoryIsRefused) {
  setDeviceRange_(gpu_, sizeof(gpu_), 1, 1);
  EXPECT_REFUSED(braidAllReduce(gpu_, host_, 64, braidFloat32, braidSum, comm_, nullptr),
                 "sendbuff is GPU managed memory (device 1)");
}

TEST_F(GpuBuffers, OtherCollectivesRefuseTheBuffersTheyUse) {
  EXPECT_REFUSED(braidBroadcast(gpu_, host_, 64, braidFloat32, 0, comm_, nullptr), "braidBroadcast",
                 "sendbuff");
  EXPECT_REFUSED(braidReduce(host_, gpu_, 64, braidFloat32, braidSum, 0, comm_, nullptr),
                 "braidReduce", "recvbuff");
  EXPECT_REFUSED(braidAllGather(gpu_, host_, 64, braidFloat32, comm_, nullptr), "braidAllGather",
                 "sendbuff");
  EXPECT_REFUSED(braidReduceScatter(host_, gpu_, 64, braidFloat32, braidSum, comm_, nullptr),
                 "braidReduceScatter", "recvbuff");
  EXPECT_REFUSED(braidAllToAll(host_, gpu_, 64, braidFloat32, comm_, nullptr), "braidAllToAll",
                 "recvbuff");
  EXPECT_REFUSED(braidGather(gpu_, host_, 64, braidFloat32, 0, comm_, nullptr), "braidGather",
                 "sendbuff");
  EXPECT_REFUSED(braidScatter(gpu_, host_, 64, braidFloat32, 0, comm_, nullptr), "braidScatter",
                 "sendbuff");
}

#endif

// A driver that cannot say what a buffer is (here a sticky error, as after
// a kernel that faulted) leaves its kind unknown: the call fails with the
// driver's message and touches no buffer, where reading GPU memory as host
// memory would crash the process.
TEST_F(GpuBuffers, ABufferOfUnknownKindIsACudaErrorNotHostMemory) {
  failPointerQueries_(700);  // CUDA_ERROR_ILLEGAL_ADDRESS
  fill(host_, 64, 1);
  float result[64] = {};
  EXPECT_BRAID_ERROR(braidAllReduce(host_, result, 64, braidFloat32, braidSum, comm_, nullptr),
                     braidUnhandledCudaError, "braidAllReduce", "sendbuff",
                     "asking the CUDA driver what memory it is", "illegal", "700");
  EXPECT_BRAID_ERROR(braidAllReduce(result, result, 64, braidFloat32, braidSum, comm_, nullptr),
                     braidUnhandledCudaError, "sendbuff", "700");
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_ERROR(braidRecv(result, 64, braidFloat32, 0, comm_, nullptr),
                     braidUnhandledCudaError, "braidRecv", "recvbuff", "700");
  EXPECT_BRAID_ERROR(braidSend(host_, 64, braidFloat32, 0, comm_, nullptr), braidUnhandledCudaError,
                     "braidSend", "sendbuff", "700");
  // The group reports its first refusal and runs nothing.
  EXPECT_BRAID_ERROR(braidGroupEnd(), braidUnhandledCudaError, "none of them ran", "braidRecv",
                     "700");
  EXPECT_EQ(result[63], 0.0f);  // no call ran
  // The driver answers again: the same calls run.
  failPointerQueries_(0);
  EXPECT_BRAID_OK(braidAllReduce(host_, result, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(result[63], 64.0f);
}

TEST_F(GpuBuffers, HostBuffersStillWork) {
  for (int i = 0; i < 64; ++i) host_[i] = static_cast<float>(i);
  float result[64] = {};
  EXPECT_BRAID_OK(braidAllReduce(host_, result, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(result[63], 63.0f);
  EXPECT_BRAID_OK(braidAllReduce(result, result, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_BRAID_OK(braidBroadcast(host_, result, 64, braidFloat32, 0, comm_, nullptr));
  // count = 0 touches no buffer, so it is not refused.
  EXPECT_BRAID_OK(braidAllReduce(gpu_, gpu_, 0, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_BRAID_OK(braidBarrier(comm_, nullptr));
}

}  // namespace
