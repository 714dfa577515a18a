// Every algorithm of every collective, run by the progress engine as GPU
// jobs (Job::gpu) in 2 to 4 forked processes that each have a stand-in
// device (fake_ipc_device.h): local steps queued on the device, messages
// over cuda_ipc connections (copied GPU to GPU through the peers' slots),
// over gpu_staged ones (copied through pinned host memory and a host
// connection, as between hosts), a mix of both, or over cuda_ipc connections
// some of which fell back to gpu_staged in their handshake (IpcOrFallback). Each rank's result must
// equal, bit for bit, what the simulator computes for the same schedules
// and inputs in host memory.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/fuse.h"
#include "algorithms/split.h"
#include "fake_ipc_device.h"
#include "src/progress.h"
#include "tests/harness/sim_network.h"
#include "transports/cuda_ipc/cuda_ipc_connection.h"
#include "transports/cuda_ipc/ipc_or_fallback.h"
#include "transports/gpu_staged/staged_connection.h"
#include "transports/loopback/loopback_connection.h"
#include "transports/stream_connection.h"
#include "transports/tcp/socket_stream.h"

namespace braid {
namespace {

using algo::CollectiveKind;
using transport::cuda_ipc::CudaIpcConnection;
using transport::cuda_ipc::DeviceMemory;
using transport::cuda_ipc::FakeIpcDevice;

// What carries the messages between two ranks' GPUs.
enum class Route {
  kIpc,     // cuda_ipc, as among the ranks of one host
  kStaged,  // gpu_staged, as between hosts
  kMixed,   // gpu_staged between ranks whose sum is odd, cuda_ipc otherwise
  // cuda_ipc over each host connection, falling back to gpu_staged over the
  // same one where it declines: rank 1 cannot open what its peers export,
  // so its pairs fall back and the others stay, as in src/gpu_path.cc.
  kDeclined,
  // cuda_ipc with every message read in place out of the sender's buffer;
  // or only those of 3000 bytes or more, the others through the slots.
  kReadInPlace,
  kSomeReadInPlace,
};

struct Case {
  const algo::Algorithm* algorithm;
  int P;
  size_t count;
  DataType dtype;
  RedOp op;
  int root;
  Route route = Route::kIpc;
};

std::string describe(const Case& c) {
  const char* route = c.route == Route::kIpc               ? "ipc"
                      : c.route == Route::kStaged          ? "staged"
                      : c.route == Route::kMixed           ? "mixed"
                      : c.route == Route::kReadInPlace     ? "read in place"
                      : c.route == Route::kSomeReadInPlace ? "some read in place"
                                                           : "declined";
  return strCat(algo::collectiveName(c.algorithm->kind), "/", c.algorithm->name, " P=", c.P,
                " count=", c.count, " ", dataTypeName(c.dtype), " ", route);
}

bool staged(const Case& c, int a, int b) {
  return c.route == Route::kStaged || (c.route == Route::kMixed && (a + b) % 2 == 1);
}

algo::CollectiveArgs argsFor(const Case& c, int rank) {
  algo::CollectiveArgs a;
  a.kind = c.algorithm->kind;
  a.count = c.count;
  a.dtype = c.dtype;
  a.op = c.op;
  a.root = c.root;
  a.rank = rank;
  a.nranks = c.P;
  a.chunkBytes = 4096;  // pipelined in many chunks, each over several slots
  return a;
}

// Inputs: small integers (as int32 or float32), different on every rank.
void fillInput(const Case& c, int rank, uint8_t* data, size_t bytes) {
  const size_t n = bytes / dataTypeSize(c.dtype);
  for (size_t i = 0; i < n; ++i) {
    const int v = static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 101) - 50;
    if (c.dtype == DataType::kFloat32) {
      const float f = static_cast<float>(v);
      std::memcpy(data + i * 4, &f, 4);
    } else {
      const int32_t x = v;
      std::memcpy(data + i * 4, &x, 4);
    }
  }
}

// One rank's run, in its own process: 0 when its result is `expected`,
// else a code naming what failed.
// Keeps the connections going until the parent says every rank is done:
// a rank that left early would take its slots, which a peer that has not
// finished its handshake still has to open.
void stayUntilAllDone(std::vector<std::unique_ptr<transport::Connection>>& owned, int doneFd,
                      int leaveFd) {
  (void)!::write(doneFd, "x", 1);
  pollfd leave{leaveFd, POLLIN, 0};
  while (::poll(&leave, 1, 1) == 0)
    for (auto& c : owned) (void)c->progress();
}

int runRank(const Case& c, int rank, const std::map<std::pair<int, int>, int>& fds,
            const std::vector<uint8_t>& expected, int doneFd, int leaveFd) {
  auto device = std::make_shared<FakeIpcDevice>();
  // A slow stream: a local step run on the host instead of queued after the
  // copies it depends on would read bytes that have not landed yet.
  device->workDelay = std::chrono::microseconds(20);
  std::vector<std::unique_ptr<transport::Connection>> owned;
  std::vector<transport::Connection*> connections(c.P);
  CudaIpcConnection::Options options;
  options.slots = 3;
  options.slotBytes = 1024;
  if (c.route == Route::kReadInPlace) options.directMinBytes = 1;
  if (c.route == Route::kSomeReadInPlace) options.directMinBytes = 3000;
  if (c.route == Route::kDeclined && rank == 1)
    device->beforeOpen = [] { return notSupported("no peer access between these GPUs"); };
  for (int p = 0; p < c.P; ++p) {
    if (p == rank) {
      owned.push_back(std::make_unique<transport::LoopbackConnection>(rank));
    } else {
      const int fd = fds.at({rank, p});
      auto control = std::make_unique<transport::StreamConnection>(
          std::make_unique<tcp::SocketStream>(tcp::Fd(fd), p), p);
      if (staged(c, rank, p) || c.route == Route::kDeclined) {
        // A small first bounce buffer, so that larger messages take new ones.
        transport::gpu_staged::StagedConnection::Options staging;
        staging.minBounceBytes = 1024;
        owned.push_back(std::move(control));
        transport::Connection& host = *owned.back();
        owned.push_back(
            std::make_unique<transport::gpu_staged::StagedConnection>(host, device, staging));
        if (c.route == Route::kDeclined) {
          transport::Connection& fallback = *owned.back();
          auto ipc = CudaIpcConnection::createShared(host, 0xfd, device, options);
          if (!ipc.isOk()) {
            (void)!::write(doneFd, "x", 1);
            return 2;
          }
          owned.push_back(
              std::make_unique<transport::cuda_ipc::IpcOrFallback>(std::move(*ipc), fallback));
        }
        connections[p] = owned.back().get();
        continue;
      }
      auto ipc = CudaIpcConnection::create(std::move(control), device, options);
      if (!ipc.isOk()) {
        (void)!::write(doneFd, "x", 1);
        return 2;
      }
      owned.push_back(std::move(*ipc));
    }
    connections[p] = owned.back().get();
  }
  // On every way out, from here on.
  struct Stay {
    std::vector<std::unique_ptr<transport::Connection>>& owned;
    int doneFd, leaveFd;
    ~Stay() { stayUntilAllDone(owned, doneFd, leaveFd); }
  } stay{owned, doneFd, leaveFd};
  algo::CollectiveArgs args = argsFor(c, rank);
  algo::Schedule schedule = c.algorithm->plan(args);
  algo::fuseReceiveReductions(schedule);
  // With staged peers the communicator splits messages into pieces: here
  // of 1000 bytes, fewer than a 4096-byte chunk, so every algorithm splits.
  if (c.route == Route::kStaged || c.route == Route::kMixed)
    schedule = algo::splitTransfers(schedule, 1000, dataTypeSize(c.dtype));
  const size_t sendBytes = algo::sendBufferBytes(args), recvBytes = algo::recvBufferBytes(args);
  auto alloc = [&](size_t n) { return device->allocate(n == 0 ? 1 : n); };
  auto send = alloc(sendBytes), recv = alloc(recvBytes), scratch = alloc(schedule.scratchBytes);
  if (!send.isOk() || !recv.isOk() || !scratch.isOk()) return 3;
  auto* sendData = static_cast<uint8_t*>((*send)->data());
  auto* recvData = static_cast<uint8_t*>((*recv)->data());
  fillInput(c, rank, sendData, sendBytes);
  std::memset(recvData, 0xee, recvBytes);

  Job job;
  job.schedule = &schedule;
  job.send = sendData;
  job.recv = recvData;
  job.scratch = static_cast<uint8_t*>((*scratch)->data());
  job.dtype = c.dtype;
  job.op = c.op;
  job.nranks = c.P;
  job.rank = rank;
  job.connections = connections;
  const uint64_t check =
      CallSignature{static_cast<uint8_t>(c.algorithm->kind), c.dtype, c.op, c.root, c.count}.pack();
  const uint64_t base = uint64_t{1} << 24;
  job.tagFor = [base, check](bool, int, uint32_t k) { return transport::Tag{base | k, check}; };
  job.tagsBelow = base + (uint64_t{1} << 24);
  job.callName = describe(c);
  job.timeoutSeconds = 30;
  job.gpu.device = device.get();
  if (Status s = runJobs(std::span<Job>(&job, 1)); !s.isOk()) {
    fprintf(stderr, "rank %d: %s\n", rank, s.message().c_str());
    return 4;
  }
  // The engine returned after the device ran everything: no synchronize here.
  if (recvBytes > 0 && std::memcmp(recvData, expected.data(), recvBytes) != 0) {
    size_t at = 0;
    while (recvData[at] == expected[at]) ++at;
    fprintf(stderr, "rank %d: %s differs from the simulator at byte %zu of %zu\n", rank,
            describe(c).c_str(), at, recvBytes);
    return 5;
  }
  // The device did the work: every rank but in a Barrier moves bytes, by
  // copies and combinations, or, read in place, by letting peers read its
  // buffers (exports) and reading theirs.
  size_t moved = device->copies.load() + device->combines.load();
  const bool readsInPlace = c.route == Route::kReadInPlace || c.route == Route::kSomeReadInPlace;
  if (readsInPlace) {
    size_t reads = 0;
    for (int p = 0; p < c.P; ++p)
      if (p != rank) reads += static_cast<CudaIpcConnection*>(connections[p])->directReads();
    if (c.route == Route::kReadInPlace && c.algorithm->kind != CollectiveKind::kBarrier &&
        device->exports.load() + reads == 0) {
      fprintf(stderr, "rank %d: %s read nothing in place\n", rank, describe(c).c_str());
      return 7;
    }
    moved += device->exports.load();
  }
  if (moved == 0 && c.algorithm->kind != CollectiveKind::kBarrier) return 6;
  return 0;
}

void runCase(const Case& c) {
  SCOPED_TRACE(describe(c));
  // What the simulator makes of the same schedules and inputs.
  std::vector<algo::Schedule> plans;
  std::vector<sim::RankMemory> memory(c.P);
  for (int r = 0; r < c.P; ++r) {
    algo::CollectiveArgs args = argsFor(c, r);
    plans.push_back(c.algorithm->plan(args));
    algo::fuseReceiveReductions(plans.back());
    memory[r].send.resize(algo::sendBufferBytes(args));
    memory[r].recv.assign(algo::recvBufferBytes(args), 0xee);
    memory[r].scratch.resize(plans.back().scratchBytes);
    fillInput(c, r, memory[r].send.data(), memory[r].send.size());
  }
  ASSERT_EQ(sim::run(plans, memory, c.dtype, c.op), "");

  std::map<std::pair<int, int>, int> fds;
  for (int a = 0; a < c.P; ++a)
    for (int b = a + 1; b < c.P; ++b) {
      int pair[2];
      ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair), 0);
      fds[{a, b}] = pair[0];
      fds[{b, a}] = pair[1];
    }
  int done[2], leave[2];
  ASSERT_EQ(::pipe(done), 0);
  ASSERT_EQ(::pipe(leave), 0);
  std::vector<pid_t> children;
  for (int r = 0; r < c.P; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (auto& [key, fd] : fds)
        if (key.first != r) ::close(fd);
      ::close(done[0]);
      ::close(leave[1]);
      _exit(runRank(c, r, fds, memory[r].recv, done[1], leave[0]));
    }
    children.push_back(pid);
  }
  for (auto& [key, fd] : fds) ::close(fd);
  ::close(done[1]);
  ::close(leave[0]);
  // Every rank done (or dead: the pipe then ends early), then all may leave.
  char byte;
  pollfd readable{done[0], POLLIN, 0};
  for (int r = 0; r < c.P && ::poll(&readable, 1, 60000) == 1 && ::read(done[0], &byte, 1) == 1;
       ++r) {
  }
  ::close(done[0]);
  ::close(leave[1]);
  for (int r = 0; r < c.P; ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(children[r], &status, 0), children[r]);
    ASSERT_TRUE(WIFEXITED(status)) << "rank " << r << " died";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "rank " << r;
  }
}

TEST(CudaIpcJobs, EveryAlgorithmOfEveryCollectiveMatchesTheSimulator) {
  int cases = 0;
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    if (a.kind == CollectiveKind::kSendRecv) continue;
    for (int P : {2, 3, 4}) {
      const size_t count = a.kind == CollectiveKind::kAllToAll ? 700 : 2500;
      runCase({&a, P, count, DataType::kInt32, RedOp::kSum, P - 1});
      ++cases;
    }
  }
  EXPECT_GT(cases, 30);
}

TEST(CudaIpcJobs, FloatAverageAndMaxRunOnTheDevice) {
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    if (a.kind != CollectiveKind::kAllReduce) continue;
    for (RedOp op : {RedOp::kAvg, RedOp::kMax}) runCase({&a, 3, 3001, DataType::kFloat32, op, 0});
  }
}

TEST(CudaIpcJobs, EveryAlgorithmOverStagedConnectionsMatchesTheSimulator) {
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    if (a.kind == CollectiveKind::kSendRecv) continue;
    for (int P : {2, 3, 4}) {
      const size_t count = a.kind == CollectiveKind::kAllToAll ? 700 : 2500;
      runCase({&a, P, count, DataType::kInt32, RedOp::kSum, P - 1, Route::kStaged});
    }
  }
}

// Each rank has peers of both kinds in one job (P = 3 and 4).
TEST(CudaIpcJobs, EveryAlgorithmOverMixedConnectionsMatchesTheSimulator) {
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    if (a.kind == CollectiveKind::kSendRecv) continue;
    for (int P : {3, 4}) {
      const size_t count = a.kind == CollectiveKind::kAllToAll ? 700 : 2500;
      runCase({&a, P, count, DataType::kInt32, RedOp::kSum, 0, Route::kMixed});
    }
  }
  for (const algo::Algorithm& a : algo::allAlgorithms())
    if (a.kind == CollectiveKind::kAllReduce)
      runCase({&a, 4, 3001, DataType::kFloat32, RedOp::kAvg, 0, Route::kMixed});
}

// Messages read in place out of the sender's buffer (a send ends only once
// its receive is posted), all of them or those of 3000 bytes and more
// beside others through the slots on the same connections.
TEST(CudaIpcJobs, EveryAlgorithmReadInPlaceMatchesTheSimulator) {
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    if (a.kind == CollectiveKind::kSendRecv) continue;
    for (int P : {2, 3, 4}) {
      const size_t count = a.kind == CollectiveKind::kAllToAll ? 700 : 2500;
      runCase({&a, P, count, DataType::kInt32, RedOp::kSum, P - 1, Route::kReadInPlace});
      runCase({&a, P, count, DataType::kInt32, RedOp::kSum, 0, Route::kSomeReadInPlace});
    }
  }
  for (const algo::Algorithm& a : algo::allAlgorithms())
    if (a.kind == CollectiveKind::kAllReduce)
      runCase({&a, 3, 3001, DataType::kFloat32, RedOp::kAvg, 0, Route::kReadInPlace});
}

// Pairs that fell back from cuda_ipc in their handshake carry whole messages
// over gpu_staged, those the engine posted before the handshake decided
// too, next to pairs that stay on cuda_ipc (P = 3 and 4).
TEST(CudaIpcJobs, EveryAlgorithmWherePairsFellBackMatchesTheSimulator) {
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    if (a.kind == CollectiveKind::kSendRecv) continue;
    for (int P : {2, 3, 4}) {
      const size_t count = a.kind == CollectiveKind::kAllToAll ? 700 : 2500;
      runCase({&a, P, count, DataType::kInt32, RedOp::kSum, P - 1, Route::kDeclined});
    }
  }
}

}  // namespace
}  // namespace braid
