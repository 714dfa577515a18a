// Every collective on GPU memory among 2, 3 and 4 processes that share one
// real GPU, through braid's C ABI: the messages go GPU to GPU over cuda_ipc
// (with each way of exporting its memory), reductions run as braid's
// kernels, and calls on a CUDA stream are ordered with the work before and
// after them on that stream. Needs a GPU: without one it exits 77 (skipped).
//
// The ranks are forked before any process of this test touches CUDA (a
// CUDA context does not survive fork); whether a GPU is there is asked by a
// child too.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "braid.h"

namespace {

// Not a multiple of any chunk or slot size, and several slots long.
constexpr size_t kCount = (size_t{1} << 20) + 37;

// Exact in a float and an int32 for every sum below.
float value(int rank, int block, size_t i) {
  return static_cast<float>(rank * 64 + block * 8 + static_cast<int>(i % 8));
}

// What one forked rank has.
struct Rank {
  int rank = 0, nranks = 0;
  braidComm_t comm = nullptr;
  cudaStream_t cudaStream = nullptr;
  braidStream_t stream = nullptr;  // over cudaStream
  float* send = nullptr;           // nranks * kCount floats of GPU memory
  float* recv = nullptr;           // the same

  int fail(const char* step, const std::string& what) const {
    std::fprintf(stderr, "rank %d of %d, %s: %s (braid: %s)\n", rank, nranks, step, what.c_str(),
                 braidGetLastError(nullptr));
    return 1;
  }
};

// A call of a collective on `stream` (NULL or the rank's braid stream).
using Call = std::function<braidResult_t(Rank&, braidStream_t)>;
// What this rank's send buffer holds before the call, and what its receive
// buffer must hold after it (only the first `expectedCount` floats).
struct Case {
  const char* name;
  std::function<float(int rank, size_t i)> input;  // i < nranks * kCount
  std::function<float(int rank, size_t i)> expected;
  size_t expectedCount;
  Call call;
};

// Runs `c` on stream NULL and on the CUDA stream. On the CUDA stream the
// input is copied in by work queued before the call, and the result copied
// out by work queued after it, neither waited for by the host in between:
// a call that ran before the copy in, or let the copy out run before its
// result landed, leaves the poison in the output.
int runCase(Rank& r, const Case& c) {
  const size_t total = static_cast<size_t>(r.nranks) * kCount;
  std::vector<float> input(total), output(total);
  for (size_t i = 0; i < total; ++i) input[i] = c.input(r.rank, i);
  for (int onStream = 0; onStream < 2; ++onStream) {
    const std::string step = std::string(c.name) + (onStream ? " on a CUDA stream" : " on NULL");
    if (cudaMemset(r.send, 0xff, total * sizeof(float)) != cudaSuccess ||
        cudaMemset(r.recv, 0xff, total * sizeof(float)) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
      return r.fail(step.c_str(), "poisoning the buffers");
    braidResult_t result;
    if (onStream) {
      cudaMemcpyAsync(r.send, input.data(), total * sizeof(float), cudaMemcpyHostToDevice,
                      r.cudaStream);
      result = c.call(r, r.stream);
      cudaMemcpyAsync(output.data(), r.recv, total * sizeof(float), cudaMemcpyDeviceToHost,
                      r.cudaStream);
      if (result == braidSuccess) result = braidStreamSynchronize(r.stream);
      if (cudaStreamSynchronize(r.cudaStream) != cudaSuccess)
        return r.fail(step.c_str(), "the CUDA stream failed");
    } else {
      cudaMemcpy(r.send, input.data(), total * sizeof(float), cudaMemcpyHostToDevice);
      result = c.call(r, nullptr);
      cudaMemcpy(output.data(), r.recv, total * sizeof(float), cudaMemcpyDeviceToHost);
    }
    if (result != braidSuccess) return r.fail(step.c_str(), braidGetErrorString(result));
    for (size_t i = 0; i < c.expectedCount; ++i)
      if (output[i] != c.expected(r.rank, i))
        return r.fail(step.c_str(), "element " + std::to_string(i) + " is " +
                                        std::to_string(output[i]) + ", not " +
                                        std::to_string(c.expected(r.rank, i)));
  }
  return 0;
}

std::vector<Case> everyCollective(int n) {
  const size_t all = static_cast<size_t>(n) * kCount;
  auto block = [](size_t i) { return static_cast<int>(i / kCount); };
  auto sumOfRanks = [n](int b, size_t i) {
    float s = 0;
    for (int p = 0; p < n; ++p) s += value(p, b, i);
    return s;
  };
  return {
      {"AllReduce", [](int r, size_t i) { return value(r, 0, i); },
       [sumOfRanks](int, size_t i) { return sumOfRanks(0, i); }, kCount,
       [](Rank& r, braidStream_t s) {
         return braidAllReduce(r.send, r.recv, kCount, braidFloat32, braidSum, r.comm, s);
       }},
      {"Broadcast", [](int r, size_t i) { return value(r, 0, i); },
       [n](int, size_t i) { return value(n - 1, 0, i); }, kCount,
       [](Rank& r, braidStream_t s) {
         return braidBroadcast(r.send, r.recv, kCount, braidFloat32, r.nranks - 1, r.comm, s);
       }},
      {"Reduce", [](int r, size_t i) { return value(r, 0, i); },
       [sumOfRanks](int r, size_t i) { return r == 0 ? sumOfRanks(0, i) : -1.0f; }, kCount,
       [](Rank& r, braidStream_t s) {
         return braidReduce(r.send, r.recv, kCount, braidFloat32, braidSum, 0, r.comm, s);
       }},
      {"AllGather", [](int r, size_t i) { return value(r, 0, i); },
       [block](int, size_t i) { return value(block(i), 0, i % kCount); }, all,
       [](Rank& r, braidStream_t s) {
         return braidAllGather(r.send, r.recv, kCount, braidFloat32, r.comm, s);
       }},
      {"ReduceScatter", [block](int r, size_t i) { return value(r, block(i), i % kCount); },
       [sumOfRanks](int r, size_t i) { return sumOfRanks(r, i); }, kCount,
       [](Rank& r, braidStream_t s) {
         return braidReduceScatter(r.send, r.recv, kCount, braidFloat32, braidSum, r.comm, s);
       }},
      {"AllToAll", [block](int r, size_t i) { return value(r, block(i), i % kCount); },
       [block](int r, size_t i) { return value(block(i), r, i % kCount); }, all,
       [](Rank& r, braidStream_t s) {
         return braidAllToAll(r.send, r.recv, kCount, braidFloat32, r.comm, s);
       }},
      {"Gather", [](int r, size_t i) { return value(r, 0, i); },
       [block](int r, size_t i) { return r == 0 ? value(block(i), 0, i % kCount) : -1.0f; }, all,
       [](Rank& r, braidStream_t s) {
         return braidGather(r.send, r.recv, kCount, braidFloat32, 0, r.comm, s);
       }},
      {"Scatter", [block](int r, size_t i) { return value(r, block(i), i % kCount); },
       [](int r, size_t i) { return value(0, r, i); }, kCount,
       [](Rank& r, braidStream_t s) {
         return braidScatter(r.send, r.recv, kCount, braidFloat32, 0, r.comm, s);
       }},
  };
}

// 0xff bytes: what a poisoned float reads as (a NaN), never equal; ranks
// that receive nothing must keep it, so expected() says -1 there and the
// check below skips them.
int checkCases(Rank& r, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    Case checked = c;
    const auto expected = c.expected;
    // Non-roots of Reduce and Gather receive nothing: not checked.
    if (expected(r.rank, 0) == -1.0f) checked.expectedCount = 0;
    if (int failed = runCase(r, checked)) return failed;
  }
  return 0;
}

// Send/Recv around a ring inside a group (stream NULL).
int ringSendRecv(Rank& r) {
  std::vector<float> input(kCount), output(kCount);
  for (size_t i = 0; i < kCount; ++i) input[i] = value(r.rank, 0, i);
  cudaMemcpy(r.send, input.data(), kCount * sizeof(float), cudaMemcpyHostToDevice);
  const int next = (r.rank + 1) % r.nranks, previous = (r.rank + r.nranks - 1) % r.nranks;
  braidGroupStart();
  braidSend(r.send, kCount, braidFloat32, next, r.comm, nullptr);
  braidRecv(r.recv, kCount, braidFloat32, previous, r.comm, nullptr);
  if (braidResult_t result = braidGroupEnd(); result != braidSuccess)
    return r.fail("Send/Recv ring", braidGetErrorString(result));
  cudaMemcpy(output.data(), r.recv, kCount * sizeof(float), cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < kCount; ++i)
    if (output[i] != value(previous, 0, i))
      return r.fail("Send/Recv ring", "element " + std::to_string(i));
  return 0;
}

// An AllReduce, an AllGather and a Send/Recv ring in one group, on stream
// NULL and on the CUDA stream (inputs copied in before the group and results
// copied out after it, on that stream): the collectives run as GPU jobs and
// the ring is staged, all together, every rank sending first.
int groupOfCollectives(Rank& r) {
  const size_t total = static_cast<size_t>(r.nranks) * kCount;
  const int next = (r.rank + 1) % r.nranks, previous = (r.rank + r.nranks - 1) % r.nranks;
  float *gathered = nullptr, *ring = nullptr;
  if (cudaMalloc(&gathered, total * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&ring, kCount * sizeof(float)) != cudaSuccess)
    return r.fail("group", "CUDA refused memory");
  std::vector<float> input(kCount), reduced(kCount), allGathered(total), ringOut(kCount);
  for (size_t i = 0; i < kCount; ++i) input[i] = value(r.rank, 0, i);
  int failed = 0;
  for (int onStream = 0; onStream < 2 && failed == 0; ++onStream) {
    const char* step = onStream ? "group on a CUDA stream" : "group on NULL";
    braidStream_t stream = onStream ? r.stream : nullptr;
    cudaStream_t cuda = onStream ? r.cudaStream : nullptr;
    cudaMemset(r.recv, 0xff, kCount * sizeof(float));
    cudaMemset(gathered, 0xff, total * sizeof(float));
    cudaMemset(ring, 0xff, kCount * sizeof(float));
    if (cudaDeviceSynchronize() != cudaSuccess) return r.fail(step, "poisoning the buffers");
    cudaMemcpyAsync(r.send, input.data(), kCount * sizeof(float), cudaMemcpyHostToDevice, cuda);
    braidGroupStart();
    braidAllReduce(r.send, r.recv, kCount, braidFloat32, braidSum, r.comm, stream);
    braidSend(r.send, kCount, braidFloat32, next, r.comm, stream);
    braidAllGather(r.send, gathered, kCount, braidFloat32, r.comm, stream);
    braidRecv(ring, kCount, braidFloat32, previous, r.comm, stream);
    braidResult_t result = braidGroupEnd();
    cudaMemcpyAsync(reduced.data(), r.recv, kCount * sizeof(float), cudaMemcpyDeviceToHost, cuda);
    cudaMemcpyAsync(allGathered.data(), gathered, total * sizeof(float), cudaMemcpyDeviceToHost,
                    cuda);
    cudaMemcpyAsync(ringOut.data(), ring, kCount * sizeof(float), cudaMemcpyDeviceToHost, cuda);
    if (result == braidSuccess && stream) result = braidStreamSynchronize(stream);
    if (cudaStreamSynchronize(cuda) != cudaSuccess) return r.fail(step, "the CUDA stream failed");
    if (result != braidSuccess) return r.fail(step, braidGetErrorString(result));
    for (size_t i = 0; i < kCount && failed == 0; ++i) {
      float sum = 0;
      for (int p = 0; p < r.nranks; ++p) sum += value(p, 0, i);
      if (reduced[i] != sum) failed = r.fail(step, "AllReduce element " + std::to_string(i));
      if (ringOut[i] != value(previous, 0, i))
        failed = r.fail(step, "Recv element " + std::to_string(i));
    }
    for (size_t i = 0; i < total && failed == 0; ++i)
      if (allGathered[i] != value(static_cast<int>(i / kCount), 0, i % kCount))
        failed = r.fail(step, "AllGather element " + std::to_string(i));
  }
  cudaFree(gathered);
  cudaFree(ring);
  return failed;
}

// One rank's whole run: joins `id`'s communicator with `environment` set,
// then runs `body`.
int runRank(int rank, int nranks, const braidUniqueId& id,
            const std::vector<std::string>& environment, const std::function<int(Rank&)>& body) {
  for (const std::string& entry : environment) putenv(const_cast<char*>(entry.c_str()));
  Rank r;
  r.rank = rank;
  r.nranks = nranks;
  const size_t bytes = static_cast<size_t>(nranks) * kCount * sizeof(float);
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&r.cudaStream, cudaStreamNonBlocking) != cudaSuccess)
    return r.fail("setup", "CUDA refused a stream");
  // GPU_TEST_MEM_ALLOC in `environment`: the buffers from braidMemAlloc,
  // read in place by default.
  if (std::getenv("GPU_TEST_MEM_ALLOC") != nullptr) {
    void* send = nullptr;
    void* recv = nullptr;
    if (braidMemAlloc(&send, bytes) != braidSuccess || braidMemAlloc(&recv, bytes) != braidSuccess)
      return r.fail("setup", "braidMemAlloc");
    r.send = static_cast<float*>(send);
    r.recv = static_cast<float*>(recv);
  } else if (cudaMalloc(&r.send, bytes) != cudaSuccess ||
             cudaMalloc(&r.recv, bytes) != cudaSuccess) {
    return r.fail("setup", "CUDA refused memory");
  }
  if (braidCommInitRank(&r.comm, nranks, id, rank) != braidSuccess)
    return r.fail("setup", "braidCommInitRank");
  if (braidStreamCreateFromCuda(r.comm, r.cudaStream, &r.stream) != braidSuccess)
    return r.fail("setup", "braidStreamCreateFromCuda");
  const int failed = body(r);
  braidStreamDestroy(r.stream);
  // braidMemAlloc's buffers may go before the communicator: every call is
  // over on this rank, and its peers hold what they still map.
  if (std::getenv("GPU_TEST_MEM_ALLOC") != nullptr && failed == 0 &&
      (braidMemFree(r.send) != braidSuccess || braidMemFree(r.recv) != braidSuccess))
    return r.fail("teardown", "braidMemFree");
  if (braidCommDestroy(r.comm) != braidSuccess && failed == 0)
    return r.fail("teardown", "braidCommDestroy");
  return failed;
}

// Forks `nranks` ranks that run `body`; the number of ranks that failed
// (each says why on stderr), a rank that hangs past `seconds` counting as
// failed (killed).
int runRanks(int nranks, const std::vector<std::string>& environment,
             const std::function<int(Rank&)>& body, int seconds = 240) {
  braidUniqueId id;
  if (braidGetUniqueId(&id) != braidSuccess) return nranks;
  std::vector<pid_t> children;
  for (int rank = 0; rank < nranks; ++rank) {
    const pid_t child = fork();
    if (child == 0) _exit(runRank(rank, nranks, id, environment, body));
    children.push_back(child);
  }
  int failed = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (pid_t child : children) {
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(child, &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (done != child) {
      kill(child, SIGKILL);
      (void)waitpid(child, &status, 0);
      std::fprintf(stderr, "a rank hung (killed after %d s)\n", seconds);
      ++failed;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
    }
  }
  return failed;
}

class GpuCollectives : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(GpuCollectives, EveryCollectiveOnStreamNullAndOnACudaStream) {
  const auto [nranks, setting] = GetParam();
  EXPECT_EQ(runRanks(nranks, {setting},
                     [](Rank& r) {
                       if (int failed = checkCases(r, everyCollective(r.nranks))) return failed;
                       if (int failed = ringSendRecv(r)) return failed;
                       return groupOfCollectives(r);
                     }),
            0)
      << "ranks failed (their stderr says why)";
}

TEST_P(GpuCollectives, EveryAllReduceAlgorithm) {
  const auto [nranks, setting] = GetParam();
  for (const char* algorithm : {"ring", "butterfly", "halving", "dbtree"}) {
    SCOPED_TRACE(algorithm);
    const std::string forced = std::string("BRAID_ALGO=allreduce=") + algorithm;
    EXPECT_EQ(runRanks(nranks, {setting, forced},
                       [algorithm](Rank& r) {
                         std::vector<Case> cases = everyCollective(r.nranks);
                         cases.resize(1);  // AllReduce
                         if (int failed = checkCases(r, cases)) return failed;
                         const char* used = "";
                         braidCommGetLastAlgorithm(r.comm, "allreduce", &used);
                         return std::strcmp(used, algorithm) == 0
                                    ? 0
                                    : r.fail("AllReduce", std::string("ran ") + used);
                       }),
              0);
  }
}

// Each way of exporting the slots, and every message read in place out of
// the sender's buffer (docs/GPU.md, "Reads in place").
INSTANTIATE_TEST_SUITE_P(OneGpu, GpuCollectives,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values("BRAID_CUDA_IPC_HANDLES=auto",
                                                              "BRAID_CUDA_IPC_HANDLES=legacy",
                                                              "BRAID_CUDA_IPC_DIRECT_BYTES=1")));

// Buffers of braidMemAlloc (cuMem memory exported as a descriptor), read in
// place with BRAID_CUDA_IPC_DIRECT_BYTES at its default.
INSTANTIATE_TEST_SUITE_P(OneGpuMemAlloc, GpuCollectives,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Values("GPU_TEST_MEM_ALLOC=1")));

// While another thread captures a CUDA graph in global mode (as
// torch.cuda.graph does), the driver refuses allocations, queries and
// synchronizations on threads whose mode is global, and would invalidate the
// capture: braid runs its driver calls in relaxed mode, so a call on a CUDA
// stream that is not capturing runs (its GPU path made during the capture),
// a call on the capturing stream is refused (braidNotSupported) without
// touching it, and the capture ends valid. Kept apart from the suite above
// (GpuCaptures.*) so that tools/gpu-checks.sh can run it on its own.
int duringAGraphCapture(Rank& r) {
  const size_t count = kCount;
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = value(r.rank, 0, i);
  float* scratch = nullptr;
  cudaStream_t captured = nullptr;
  if (cudaMemcpy(r.send, host.data(), count * sizeof(float), cudaMemcpyHostToDevice) !=
          cudaSuccess ||
      cudaMalloc(&scratch, 4096) != cudaSuccess ||
      cudaStreamCreateWithFlags(&captured, cudaStreamNonBlocking) != cudaSuccess)
    return r.fail("capture setup", "CUDA refused memory or a stream");
  std::atomic<int> phase{0};
  cudaError_t began = cudaErrorUnknown, ended = cudaErrorUnknown;
  cudaGraph_t graph = nullptr;
  std::thread capturer([&] {
    cudaSetDevice(0);
    began = cudaStreamBeginCapture(captured, cudaStreamCaptureModeGlobal);
    (void)cudaMemsetAsync(scratch, 0, 4096, captured);
    phase = 1;
    while (phase.load() != 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ended = cudaStreamEndCapture(captured, &graph);
  });
  while (phase.load() != 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const braidResult_t onAnother =
      braidAllReduce(r.send, r.recv, count, braidFloat32, braidSum, r.comm, r.stream);
  const braidResult_t synchronized = braidStreamSynchronize(r.stream);
  braidStream_t onCaptured = nullptr;
  braidResult_t refused = braidStreamCreateFromCuda(r.comm, captured, &onCaptured);
  if (refused == braidSuccess)
    refused = braidAllReduce(r.send, r.recv, count, braidFloat32, braidSum, r.comm, onCaptured);
  phase = 2;
  capturer.join();
  int failed = 0;
  if (began != cudaSuccess) failed = r.fail("capture", cudaGetErrorString(began));
  if (!failed && onAnother != braidSuccess) failed = r.fail("capture", "the AllReduce failed");
  if (!failed && synchronized != braidSuccess)
    failed = r.fail("capture", "braidStreamSynchronize failed");
  if (!failed && refused != braidNotSupported)
    failed = r.fail("capture", "a call on the capturing stream was not refused");
  if (!failed && (ended != cudaSuccess || graph == nullptr))
    failed =
        r.fail("capture", std::string("the capture ended invalid: ") + cudaGetErrorString(ended));
  if (!failed && (cudaStreamSynchronize(r.cudaStream) != cudaSuccess ||
                  cudaMemcpy(host.data(), r.recv, count * sizeof(float), cudaMemcpyDeviceToHost) !=
                      cudaSuccess))
    failed = r.fail("capture", "reading the result");
  for (size_t i = 0; !failed && i < count; ++i) {
    float sum = 0;
    for (int peer = 0; peer < r.nranks; ++peer) sum += value(peer, 0, i);
    if (host[i] != sum) failed = r.fail("capture", "element " + std::to_string(i) + " is wrong");
  }
  if (onCaptured != nullptr) braidStreamDestroy(onCaptured);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(captured);
  cudaFree(scratch);
  return failed;
}

TEST(GpuCaptures, CallsRunWhileAnotherThreadCapturesAndTheCapturingStreamIsRefused) {
  EXPECT_EQ(runRanks(2, {}, duringAGraphCapture), 0) << "ranks failed (their stderr says why)";
}

// The first GPU call of a communicator on a CUDA stream, followed at once by
// a copy of its result to pageable memory on that stream, as tensor.cpu()
// or loss.item() do: that copy holds the calling thread, and a lock of the
// driver's, until the stream reaches it, while braid's thread runs the call
// (and makes what the call needs). Then a call larger than any before it,
// the same way. Neither may hang: a rank is killed after 60 s. Kept apart
// (GpuFirstCalls.*) so that tools/gpu-checks.sh runs it in a step of its
// own, outside the core checks.
int pageableCopyRightAfterTheCall(Rank& r) {
  for (const size_t count : {kCount / 4, kCount}) {
    const std::string step = "AllReduce of " + std::to_string(count) + " floats";
    std::vector<float> input(count), output(count, -1.0f);
    for (size_t i = 0; i < count; ++i) input[i] = value(r.rank, 0, i);
    const size_t bytes = count * sizeof(float);
    if (cudaMemcpyAsync(r.send, input.data(), bytes, cudaMemcpyHostToDevice, r.cudaStream) !=
        cudaSuccess)
      return r.fail(step.c_str(), "copying the input in");
    braidResult_t result =
        braidAllReduce(r.send, r.recv, count, braidFloat32, braidSum, r.comm, r.stream);
    const cudaError_t copied =
        cudaMemcpyAsync(output.data(), r.recv, bytes, cudaMemcpyDeviceToHost, r.cudaStream);
    if (result == braidSuccess) result = braidStreamSynchronize(r.stream);
    if (copied != cudaSuccess || cudaStreamSynchronize(r.cudaStream) != cudaSuccess)
      return r.fail(step.c_str(), "copying the result out");
    if (result != braidSuccess) return r.fail(step.c_str(), braidGetErrorString(result));
    for (size_t i = 0; i < count; ++i) {
      float sum = 0;
      for (int peer = 0; peer < r.nranks; ++peer) sum += value(peer, 0, i);
      if (output[i] != sum) return r.fail(step.c_str(), "element " + std::to_string(i));
    }
  }
  return 0;
}

TEST(GpuFirstCalls, APageableCopyRightAfterTheFirstCallsOnACudaStreamDoesNotHang) {
  EXPECT_EQ(runRanks(2, {}, pageableCopyRightAfterTheCall, 60), 0)
      << "ranks failed (their stderr says why)";
}

// Whether a GPU is usable, asked in a child so that this process stays
// without CUDA (its ranks are forked from it).
bool gpuPresent(std::string& why) {
  int pipeFds[2];
  if (pipe(pipeFds) != 0) return false;
  const pid_t child = fork();
  if (child == 0) {
    int devices = 0;
    const cudaError_t error = cudaGetDeviceCount(&devices);
    const char* text = cudaGetErrorString(error != cudaSuccess ? error
                                          : devices == 0       ? cudaErrorNoDevice
                                                               : error);
    (void)!write(pipeFds[1], text, std::strlen(text));
    _exit(error == cudaSuccess && devices > 0 ? 0 : 1);
  }
  close(pipeFds[1]);
  char text[256] = {};
  (void)!read(pipeFds[0], text, sizeof(text) - 1);
  close(pipeFds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  why = text;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

// Exit status 77 is how meson counts a test as skipped.
int main(int argc, char** argv) {
  std::string why;
  if (!gpuPresent(why)) {
    std::printf("SKIP: no CUDA device here (%s)\n", why.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
