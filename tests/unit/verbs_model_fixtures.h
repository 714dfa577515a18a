// Helpers shared by the verbs model tests (one executable): endpoints, connected pairs, polling.
//
// The software model of the verbs (model_verbs.h): the semantics the
// InfiniBand transport relies on, and the failures hardware would give.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transports/ib/model_verbs.h"

namespace braid::ib {
namespace {

constexpr uint8_t kRocePort = 1;
constexpr uint8_t kInfinibandPort = 2;
constexpr int kGidIndex = 1;
constexpr uint8_t kTimeout = 14;
constexpr uint8_t kRetryCount = 7;
constexpr uint8_t kRnrRetryWithoutEnd = 7;
constexpr AccessFlags kWritable{.localWrite = true, .remoteWrite = true};

// Set-up steps that must work: a failure ends the test binary with why.
template <typename T>
T take(Result<T> result) {
  if (!result.isOk()) {
    std::fprintf(stderr, "set-up failed: %s\n", result.status().message().c_str());
    std::abort();
  }
  return std::move(result).value();
}

// One side of a connection: a queue pair, its queues and a registered
// buffer.
struct Endpoint {
  std::unique_ptr<Device> device;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> sendCq;
  std::unique_ptr<CompletionQueue> recvCq;
  std::unique_ptr<QueuePair> qp;
  std::vector<uint8_t> buffer;
  std::unique_ptr<MemoryRegion> mr;
  uint8_t port = kRocePort;
  uint32_t psn = 0;
  AccessFlags qpAccess = kWritable;

  QueuePairAddress address() const {
    QueuePairAddress a;
    a.qpn = qp->qpn();
    a.psn = psn;
    a.lid = take(device->queryPort(port)).lid;
    if (port == kRocePort) {
      a.gid = take(device->queryGid(port, kGidIndex));
      a.gidIndex = kGidIndex;
    }
    return a;
  }
  LocalBuffer local(size_t offset, uint32_t bytes) {
    return {buffer.data() + offset, bytes, mr->lkey()};
  }
  RemoteBuffer remote(size_t offset) const {
    return {reinterpret_cast<uint64_t>(buffer.data()) + offset, mr->rkey()};
  }
};

struct EndpointOptions {
  std::string device = "model0";
  int cqEntries = 64;
  QueuePairCapacity capacity{64, 64};
  AccessFlags mrAccess = kWritable;
  AccessFlags qpAccess = kWritable;
  size_t bytes = 4096;
  uint32_t psn = 100;
};

inline Endpoint makeEndpoint(const EndpointOptions& options = {}) {
  Endpoint e;
  e.device = take(openModelDevice(options.device));
  e.pd = take(e.device->allocProtectionDomain());
  e.sendCq = take(e.device->createCompletionQueue(options.cqEntries));
  e.recvCq = take(e.device->createCompletionQueue(options.cqEntries));
  e.qp = take(e.pd->createQueuePair(*e.sendCq, *e.recvCq, options.capacity));
  e.buffer.assign(options.bytes, 0);
  e.mr = take(e.pd->registerMemory(e.buffer.data(), e.buffer.size(), options.mrAccess));
  e.psn = options.psn;
  e.qpAccess = options.qpAccess;
  return e;
}

inline void bringUp(Endpoint& self, const QueuePairAddress& peer, uint8_t rnrRetry) {
  ASSERT_TRUE(self.qp->toInit(self.port, self.qpAccess).isOk());
  ASSERT_TRUE(self.qp->toReadyToReceive(peer, Mtu::k1024).isOk());
  Status rts = self.qp->toReadyToSend(self.psn, kTimeout, kRetryCount, rnrRetry);
  ASSERT_TRUE(rts.isOk()) << rts.message();
}

inline void connect(Endpoint& a, Endpoint& b, uint8_t rnrRetry = kRnrRetryWithoutEnd) {
  const QueuePairAddress toA = a.address();
  const QueuePairAddress toB = b.address();
  bringUp(a, toB, rnrRetry);
  bringUp(b, toA, rnrRetry);
}

// A connected pair on two devices, b's psn different from a's.
struct Pair {
  Endpoint a;
  Endpoint b;
};

inline Pair makePair(EndpointOptions aOptions = {}, EndpointOptions bOptions = {},
                     uint8_t rnrRetry = kRnrRetryWithoutEnd) {
  bOptions.device = "model1";
  bOptions.psn = 7000;
  Pair p{makeEndpoint(aOptions), makeEndpoint(bOptions)};
  connect(p.a, p.b, rnrRetry);
  return p;
}

inline std::vector<Completion> drain(CompletionQueue& cq) {
  std::vector<Completion> all;
  std::array<Completion, 4> batch;
  for (;;) {
    Result<int> n = cq.poll(batch);
    EXPECT_TRUE(n.isOk()) << n.status().message();
    if (!n.isOk() || *n == 0) return all;
    all.insert(all.end(), batch.begin(), batch.begin() + *n);
  }
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace
}  // namespace braid::ib
