// The software model of the verbs (model_verbs.h): the semantics the
// InfiniBand transport relies on, and the failures hardware would give.
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

Endpoint makeEndpoint(const EndpointOptions& options = {}) {
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

void bringUp(Endpoint& self, const QueuePairAddress& peer, uint8_t rnrRetry) {
  ASSERT_TRUE(self.qp->toInit(self.port, self.qpAccess).isOk());
  ASSERT_TRUE(self.qp->toReadyToReceive(peer, Mtu::k1024).isOk());
  Status rts = self.qp->toReadyToSend(self.psn, kTimeout, kRetryCount, rnrRetry);
  ASSERT_TRUE(rts.isOk()) << rts.message();
}

void connect(Endpoint& a, Endpoint& b, uint8_t rnrRetry = kRnrRetryWithoutEnd) {
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

Pair makePair(EndpointOptions aOptions = {}, EndpointOptions bOptions = {},
              uint8_t rnrRetry = kRnrRetryWithoutEnd) {
  bOptions.device = "model1";
  bOptions.psn = 7000;
  Pair p{makeEndpoint(aOptions), makeEndpoint(bOptions)};
  connect(p.a, p.b, rnrRetry);
  return p;
}

std::vector<Completion> drain(CompletionQueue& cq) {
  std::vector<Completion> all;
  std::array<Completion, 4> batch;
  for (;;) {
    Result<int> n = cq.poll(batch);
    EXPECT_TRUE(n.isOk()) << n.status().message();
    if (!n.isOk() || *n == 0) return all;
    all.insert(all.end(), batch.begin(), batch.begin() + *n);
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(VerbsModelDevice, OpensByNameOrFirstAndDescribesItsPorts) {
  auto first = take(openModelDevice());
  EXPECT_EQ(first->name(), "model0");
  auto second = take(openModelDevice("model1"));
  EXPECT_EQ(second->name(), "model1");
  auto missing = openModelDevice("mlx5_9");
  ASSERT_FALSE(missing.isOk());
  EXPECT_TRUE(contains(missing.status().message(), "model0, model1")) << missing.status().message();

  PortInfo roce = take(second->queryPort(kRocePort));
  EXPECT_TRUE(roce.active());
  EXPECT_EQ(roce.linkLayer, LinkLayer::kEthernet);
  EXPECT_EQ(roce.gidTableLength, 2);
  PortInfo ib = take(second->queryPort(kInfinibandPort));
  EXPECT_EQ(ib.linkLayer, LinkLayer::kInfiniBand);
  EXPECT_EQ(ib.lid, 2);
  EXPECT_FALSE(second->queryPort(3).isOk());
  EXPECT_FALSE(take(second->queryGid(kRocePort, 1)).isZero());
  EXPECT_NE(take(first->queryGid(kRocePort, 1)), take(second->queryGid(kRocePort, 1)));
  EXPECT_FALSE(second->queryGid(kRocePort, 2).isOk());
}

TEST(VerbsModelMemory, RemoteWriteWithoutLocalWriteIsRefusedAsInVerbs) {
  auto device = take(openModelDevice());
  auto pd = take(device->allocProtectionDomain());
  std::vector<uint8_t> buffer(64);
  auto mr = pd->registerMemory(buffer.data(), buffer.size(), {.remoteWrite = true});
  ASSERT_FALSE(mr.isOk());
  EXPECT_TRUE(contains(mr.status().message(), "local write")) << mr.status().message();
  auto ok = take(pd->registerMemory(buffer.data(), buffer.size(), kWritable));
  EXPECT_NE(ok->lkey(), ok->rkey());
  EXPECT_EQ(ok->addr(), buffer.data());
  EXPECT_EQ(ok->length(), 64u);
}

TEST(VerbsModelStateMachine, ResetInitRtrRtsInOrder) {
  Endpoint a = makeEndpoint();
  Endpoint b = makeEndpoint({.device = "model1"});
  EXPECT_EQ(a.qp->state(), QueuePairState::kReset);
  ASSERT_TRUE(a.qp->toInit(kRocePort, kWritable).isOk());
  EXPECT_EQ(a.qp->state(), QueuePairState::kInit);
  ASSERT_TRUE(a.qp->toReadyToReceive(b.address(), Mtu::k4096).isOk());
  EXPECT_EQ(a.qp->state(), QueuePairState::kReadyToReceive);
  ASSERT_TRUE(a.qp->toReadyToSend(a.psn, kTimeout, kRetryCount, 7).isOk());
  EXPECT_EQ(a.qp->state(), QueuePairState::kReadyToSend);
}

TEST(VerbsModelStateMachine, OutOfOrderTransitionsAreRefusedNamingTheStates) {
  Endpoint a = makeEndpoint();
  Endpoint b = makeEndpoint({.device = "model1"});
  Status s = a.qp->toReadyToReceive(b.address(), Mtu::k1024);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidUsage);
  EXPECT_TRUE(contains(s.message(), "RESET -> RTR refused")) << s.message();
  s = a.qp->toReadyToSend(1, kTimeout, kRetryCount, 7);
  EXPECT_TRUE(contains(s.message(), "RESET -> RTS refused")) << s.message();
  EXPECT_EQ(a.qp->state(), QueuePairState::kReset);

  ASSERT_TRUE(a.qp->toInit(kRocePort, kWritable).isOk());
  s = a.qp->toInit(kRocePort, kWritable);
  EXPECT_TRUE(contains(s.message(), "INIT -> INIT refused")) << s.message();
  s = a.qp->toReadyToSend(1, kTimeout, kRetryCount, 7);
  EXPECT_TRUE(contains(s.message(), "INIT -> RTS refused")) << s.message();
  EXPECT_EQ(a.qp->state(), QueuePairState::kInit);

  ASSERT_TRUE(a.qp->toReadyToReceive(b.address(), Mtu::k1024).isOk());
  s = a.qp->toInit(kRocePort, kWritable);
  EXPECT_TRUE(contains(s.message(), "RTR -> INIT refused")) << s.message();
  EXPECT_EQ(a.qp->state(), QueuePairState::kReadyToReceive);
}

TEST(VerbsModelStateMachine, BadPathParametersAreRefused) {
  Endpoint a = makeEndpoint();
  Endpoint b = makeEndpoint({.device = "model1"});
  EXPECT_EQ(a.qp->toInit(9, kWritable).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(a.qp->toInit(kRocePort, kWritable).isOk());
  QueuePairAddress noGid = b.address();
  noGid.gid = Gid{};
  Status s = a.qp->toReadyToReceive(noGid, Mtu::k1024);
  EXPECT_TRUE(contains(s.message(), "RoCE path needs the peer's GID")) << s.message();
  QueuePairAddress badIndex = b.address();
  badIndex.gidIndex = 5;
  EXPECT_EQ(a.qp->toReadyToReceive(badIndex, Mtu::k1024).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(a.qp->toReadyToReceive(b.address(), Mtu::k1024).isOk());
  EXPECT_EQ(a.qp->toReadyToSend(1, kTimeout, kRetryCount, 8).code(), ErrorCode::kInvalidArgument);
}

TEST(VerbsModelStateMachine, SendsNeedRtsAndReceivesNeedInit) {
  Endpoint a = makeEndpoint();
  Endpoint b = makeEndpoint({.device = "model1"});
  Status s = a.qp->postRecv(1);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidUsage);
  EXPECT_TRUE(contains(s.message(), "RESET")) << s.message();
  s = a.qp->postWriteWithImm(1, a.local(0, 8), b.remote(0), 5, true);
  EXPECT_TRUE(contains(s.message(), "state RESET; sends need RTS")) << s.message();

  ASSERT_TRUE(a.qp->toInit(kRocePort, kWritable).isOk());
  EXPECT_TRUE(a.qp->postRecv(1).isOk());
  s = a.qp->postWrite(2, a.local(0, 8), b.remote(0), true);
  EXPECT_TRUE(contains(s.message(), "state INIT; sends need RTS")) << s.message();
  ASSERT_TRUE(a.qp->toReadyToReceive(b.address(), Mtu::k1024).isOk());
  s = a.qp->postWrite(3, a.local(0, 8), b.remote(0), true);
  EXPECT_TRUE(contains(s.message(), "state RTR; sends need RTS")) << s.message();
  EXPECT_TRUE(drain(*a.sendCq).empty());
}

TEST(VerbsModelWrite, WithImmLandsBytesAndCompletesAtBothEnds) {
  Pair p = makePair();
  const char message[] = "twenty-one bytes long";
  std::memcpy(p.a.buffer.data() + 100, message, 21);
  ASSERT_TRUE(p.b.qp->postRecv(77).isOk());
  ASSERT_TRUE(
      p.a.qp->postWriteWithImm(5, p.a.local(100, 21), p.b.remote(300), 0xabcd1234, true).isOk());
  EXPECT_EQ(std::memcmp(p.b.buffer.data() + 300, message, 21), 0);
  EXPECT_EQ(p.b.buffer[299], 0);
  EXPECT_EQ(p.b.buffer[321], 0);

  std::vector<Completion> sent = drain(*p.a.sendCq);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].wrId, 5u);
  EXPECT_EQ(sent[0].status, CompletionStatus::kSuccess);
  EXPECT_EQ(sent[0].opcode, CompletionOpcode::kRdmaWrite);
  std::vector<Completion> received = drain(*p.b.recvCq);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].wrId, 77u);
  EXPECT_TRUE(received[0].ok());
  EXPECT_EQ(received[0].opcode, CompletionOpcode::kRecvRdmaWithImm);
  EXPECT_EQ(received[0].byteLen, 21u);
  EXPECT_TRUE(received[0].hasImm);
  EXPECT_EQ(received[0].imm, 0xabcd1234u);
  EXPECT_TRUE(drain(*p.a.recvCq).empty());
  EXPECT_TRUE(drain(*p.b.sendCq).empty());
}

TEST(VerbsModelWrite, ZeroBytesWithImmCarriesOnlyTheImmediate) {
  Pair p = makePair();
  ASSERT_TRUE(p.b.qp->postRecv(1).isOk());
  ASSERT_TRUE(p.a.qp->postWriteWithImm(2, {}, {}, 99, true).isOk());
  std::vector<Completion> received = drain(*p.b.recvCq);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].byteLen, 0u);
  EXPECT_EQ(received[0].imm, 99u);
}

TEST(VerbsModelWrite, UnsignaledWriteGivesNoSendCompletion) {
  Pair p = makePair();
  std::memset(p.a.buffer.data(), 0x5a, 64);
  ASSERT_TRUE(p.b.qp->postRecv(1).isOk());
  ASSERT_TRUE(p.a.qp->postWriteWithImm(1, p.a.local(0, 32), p.b.remote(0), 1, false).isOk());
  ASSERT_TRUE(p.a.qp->postWrite(2, p.a.local(32, 32), p.b.remote(32), false).isOk());
  EXPECT_TRUE(drain(*p.a.sendCq).empty());
  EXPECT_EQ(p.b.buffer[0], 0x5a);
  EXPECT_EQ(p.b.buffer[63], 0x5a);
  // A plain write consumes no receive and tells the target nothing.
  EXPECT_EQ(drain(*p.b.recvCq).size(), 1u);
  ASSERT_TRUE(p.a.qp->postWrite(3, p.a.local(0, 8), p.b.remote(0), true).isOk());
  std::vector<Completion> sent = drain(*p.a.sendCq);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].wrId, 3u);
}

TEST(VerbsModelWrite, ReceivesAreConsumedOldestFirst) {
  Pair p = makePair();
  for (uint64_t wrId : {10, 11, 12}) ASSERT_TRUE(p.b.qp->postRecv(wrId).isOk());
  for (uint32_t imm : {1, 2, 3})
    ASSERT_TRUE(p.a.qp->postWriteWithImm(imm, p.a.local(0, imm), p.b.remote(0), imm, false).isOk());
  std::vector<Completion> received = drain(*p.b.recvCq);
  ASSERT_EQ(received.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(received[i].wrId, 10 + i);
    EXPECT_EQ(received[i].imm, 1 + i);
    EXPECT_EQ(received[i].byteLen, 1 + i);
  }
}

TEST(VerbsModelWrite, InfinibandPortsRouteByLid) {
  Endpoint a = makeEndpoint();
  Endpoint b = makeEndpoint({.device = "model1", .psn = 3});
  a.port = b.port = kInfinibandPort;
  connect(a, b);
  ASSERT_TRUE(b.qp->postRecv(1).isOk());
  ASSERT_TRUE(a.qp->postWriteWithImm(1, a.local(0, 8), b.remote(0), 4, true).isOk());
  std::vector<Completion> sent = drain(*a.sendCq);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].ok()) << completionStatusName(sent[0].status);
  EXPECT_EQ(drain(*b.recvCq).size(), 1u);
}

// The sender sees the error even unsignaled, goes to ERROR, and what it
// posts after is flushed; the target gets nothing.
void expectRemoteAccessError(Pair& p, RemoteBuffer target, uint32_t bytes) {
  ASSERT_TRUE(p.b.qp->postRecv(1).isOk());
  std::memset(p.a.buffer.data(), 0x77, 64);
  ASSERT_TRUE(p.a.qp->postWriteWithImm(10, p.a.local(0, bytes), target, 1, false).isOk());
  ASSERT_TRUE(p.a.qp->postWriteWithImm(11, p.a.local(0, 8), p.b.remote(0), 2, false).isOk());
  ASSERT_TRUE(p.a.qp->postWrite(12, p.a.local(0, 8), p.b.remote(0), true).isOk());
  std::vector<Completion> sent = drain(*p.a.sendCq);
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[0].wrId, 10u);
  EXPECT_EQ(sent[0].status, CompletionStatus::kRemoteAccessError);
  EXPECT_STREQ(completionStatusName(sent[0].status), "remote access error");
  EXPECT_EQ(sent[1].wrId, 11u);
  EXPECT_EQ(sent[1].status, CompletionStatus::kWorkRequestFlushError);
  EXPECT_EQ(static_cast<int>(sent[1].status), 5);
  EXPECT_EQ(sent[2].wrId, 12u);
  EXPECT_EQ(sent[2].status, CompletionStatus::kWorkRequestFlushError);
  EXPECT_EQ(p.a.qp->state(), QueuePairState::kError);
  EXPECT_TRUE(drain(*p.b.recvCq).empty());
  for (uint8_t byte : p.b.buffer) ASSERT_EQ(byte, 0);
}

TEST(VerbsModelAccess, WrongRkeyIsARemoteAccessError) {
  Pair p = makePair();
  RemoteBuffer wrong = p.b.remote(0);
  wrong.rkey = p.b.mr->lkey();
  expectRemoteAccessError(p, wrong, 8);
}

TEST(VerbsModelAccess, RkeyOfAnotherProtectionDomainIsARemoteAccessError) {
  Pair p = makePair();
  expectRemoteAccessError(p, {p.b.remote(0).addr, p.a.mr->rkey()}, 8);
}

TEST(VerbsModelAccess, WriteBeyondTheRegionIsARemoteAccessError) {
  Pair p = makePair();
  expectRemoteAccessError(p, p.b.remote(p.b.buffer.size() - 4), 8);
}

TEST(VerbsModelAccess, RegionWithoutRemoteWriteIsARemoteAccessError) {
  Pair p = makePair({}, {.mrAccess = {.localWrite = true, .remoteRead = true}});
  expectRemoteAccessError(p, p.b.remote(0), 8);
}

TEST(VerbsModelAccess, WrongLkeyIsALocalProtectionError) {
  Pair p = makePair();
  ASSERT_TRUE(p.b.qp->postRecv(1).isOk());
  LocalBuffer wrong = p.a.local(0, 8);
  wrong.lkey = p.a.mr->rkey();
  ASSERT_TRUE(p.a.qp->postWriteWithImm(1, wrong, p.b.remote(0), 1, false).isOk());
  std::vector<Completion> sent = drain(*p.a.sendCq);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, CompletionStatus::kLocalProtectionError);
  EXPECT_EQ(p.a.qp->state(), QueuePairState::kError);
}

constexpr AccessFlags kReadable{.localWrite = true, .remoteWrite = true, .remoteRead = true};

Pair readablePair(AccessFlags aRegion = kReadable, AccessFlags bRegion = kReadable,
                  AccessFlags bQueuePair = kReadable) {
  EndpointOptions a, b;
  a.mrAccess = aRegion;
  a.qpAccess = kReadable;
  b.mrAccess = bRegion;
  b.qpAccess = bQueuePair;
  return makePair(a, b);
}

TEST(VerbsModelRead, ReadCopiesThePeersBytesAndConsumesNoReceive) {
  Pair p = readablePair();
  for (size_t i = 0; i < p.b.buffer.size(); ++i) p.b.buffer[i] = static_cast<uint8_t>(i * 3);
  ASSERT_TRUE(p.a.qp->postRead(7, p.a.local(0, 100), p.b.remote(50), true).isOk());
  std::vector<Completion> done = drain(*p.a.sendCq);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok());
  EXPECT_EQ(done[0].wrId, 7u);
  EXPECT_EQ(done[0].opcode, CompletionOpcode::kRdmaRead);
  EXPECT_EQ(done[0].byteLen, 100u);
  EXPECT_TRUE(std::equal(p.a.buffer.begin(), p.a.buffer.begin() + 100, p.b.buffer.begin() + 50));
  EXPECT_TRUE(drain(*p.b.recvCq).empty());
  // Writes still work after it: the PSNs stayed in step.
  ASSERT_TRUE(p.a.qp->postWrite(8, p.a.local(0, 8), p.b.remote(0), true).isOk());
  ASSERT_EQ(drain(*p.a.sendCq).size(), 1u);
  EXPECT_EQ(p.a.qp->state(), QueuePairState::kReadyToSend);
}

TEST(VerbsModelRead, ARegionOrQueuePairWithoutRemoteReadIsARemoteAccessError) {
  for (bool regionReadable : {false, true}) {
    Pair p = readablePair(kReadable, regionReadable ? kReadable : kWritable,
                          regionReadable ? kWritable : kReadable);
    ASSERT_TRUE(p.a.qp->postRead(1, p.a.local(0, 8), p.b.remote(0), false).isOk());
    std::vector<Completion> done = drain(*p.a.sendCq);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, CompletionStatus::kRemoteAccessError) << regionReadable;
  }
}

TEST(VerbsModelRead, ReadingIntoARegionWithoutLocalWriteIsALocalProtectionError) {
  Pair p = readablePair(AccessFlags{.remoteRead = true});
  ASSERT_TRUE(p.a.qp->postRead(1, p.a.local(0, 8), p.b.remote(0), false).isOk());
  std::vector<Completion> done = drain(*p.a.sendCq);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, CompletionStatus::kLocalProtectionError);
}

TEST(VerbsModelPeer, DestroyedPeerIsRetryExceeded) {
  Pair p = makePair();
  p.b.qp.reset();
  ASSERT_TRUE(p.a.qp->postWriteWithImm(1, p.a.local(0, 8), p.b.remote(0), 1, true).isOk());
  ASSERT_TRUE(p.a.qp->postWrite(2, p.a.local(0, 8), p.b.remote(0), false).isOk());
  std::vector<Completion> sent = drain(*p.a.sendCq);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(static_cast<int>(sent[0].status), 12);
  EXPECT_EQ(sent[0].status, CompletionStatus::kRetryExceeded);
  EXPECT_STREQ(completionStatusName(sent[0].status), "transport retry counter exceeded");
  EXPECT_EQ(sent[1].status, CompletionStatus::kWorkRequestFlushError);
  EXPECT_EQ(p.a.qp->state(), QueuePairState::kError);
}

TEST(VerbsModelPeer, PeerInErrorIsRetryExceededAndFlushesItsReceives) {
  Pair p = makePair();
  ASSERT_TRUE(p.b.qp->postRecv(40).isOk());
  // b breaks itself by writing with a bad key; its posted receive flushes.
  ASSERT_TRUE(p.b.qp->postWrite(1, p.b.local(0, 8), {0, 1}, false).isOk());
  EXPECT_EQ(p.b.qp->state(), QueuePairState::kError);
  std::vector<Completion> flushed = drain(*p.b.recvCq);
  ASSERT_EQ(flushed.size(), 1u);
  EXPECT_EQ(flushed[0].wrId, 40u);
  EXPECT_EQ(flushed[0].status, CompletionStatus::kWorkRequestFlushError);
  // Receives posted in ERROR complete at once, flushed.
  ASSERT_TRUE(p.b.qp->postRecv(41).isOk());
  EXPECT_EQ(drain(*p.b.recvCq).at(0).status, CompletionStatus::kWorkRequestFlushError);

  ASSERT_TRUE(p.a.qp->postWrite(2, p.a.local(0, 8), p.b.remote(0), true).isOk());
  std::vector<Completion> sent = drain(*p.a.sendCq);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, CompletionStatus::kRetryExceeded);
}

TEST(VerbsModelPeer, MismatchedPsnIsRetryExceeded) {
  Endpoint a = makeEndpoint();
  Endpoint b = makeEndpoint({.device = "model1", .psn = 500});
  QueuePairAddress toB = b.address();
  QueuePairAddress toA = a.address();
  toA.psn += 1;  // b expects a PSN a never sends
  bringUp(a, toB, kRnrRetryWithoutEnd);
  bringUp(b, toA, kRnrRetryWithoutEnd);
  // The direction set up right works (first: a failed write breaks a).
  ASSERT_TRUE(b.qp->postWrite(1, b.local(0, 8), a.remote(0), true).isOk());
  EXPECT_TRUE(drain(*b.sendCq).at(0).ok());
  ASSERT_TRUE(a.qp->postWrite(1, a.local(0, 8), b.remote(0), true).isOk());
  EXPECT_EQ(drain(*a.sendCq).at(0).status, CompletionStatus::kRetryExceeded);
}

TEST(VerbsModelPeer, PeerConnectedElsewhereIsRetryExceeded) {
  Pair p = makePair();
  Endpoint c = makeEndpoint();
  bringUp(c, p.b.address(), kRnrRetryWithoutEnd);  // b's remote side names a, not c
  ASSERT_TRUE(c.qp->postWrite(1, c.local(0, 8), p.b.remote(0), true).isOk());
  EXPECT_EQ(drain(*c.sendCq).at(0).status, CompletionStatus::kRetryExceeded);
}

TEST(VerbsModelRnr, WithoutEndTheWriteWaitsForAReceiveAndLaterWritesStayBehindIt) {
  Pair p = makePair();
  p.a.buffer[0] = 1;
  p.a.buffer[1] = 2;
  ASSERT_TRUE(p.a.qp->postWriteWithImm(1, p.a.local(0, 1), p.b.remote(0), 100, true).isOk());
  ASSERT_TRUE(p.a.qp->postWrite(2, p.a.local(1, 1), p.b.remote(1), true).isOk());
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(drain(*p.a.sendCq).empty());
  EXPECT_EQ(p.b.buffer[0], 0);
  EXPECT_EQ(p.b.buffer[1], 0) << "a write overtook the one waiting before it";
  EXPECT_EQ(p.a.qp->state(), QueuePairState::kReadyToSend);

  ASSERT_TRUE(p.b.qp->postRecv(9).isOk());
  EXPECT_EQ(p.b.buffer[0], 1);
  EXPECT_EQ(p.b.buffer[1], 2);
  std::vector<Completion> sent = drain(*p.a.sendCq);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].wrId, 1u);
  EXPECT_EQ(sent[1].wrId, 2u);
  std::vector<Completion> received = drain(*p.b.recvCq);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].imm, 100u);
}

TEST(VerbsModelRnr, CountedRetriesRunOutAfterRnrRetryPolls) {
  constexpr uint8_t kRnrRetry = 3;
  Pair p = makePair({}, {}, kRnrRetry);
  ASSERT_TRUE(p.a.qp->postWriteWithImm(1, p.a.local(0, 8), p.b.remote(0), 1, false).isOk());
  std::array<Completion, 4> batch;
  for (int poll = 1; poll < kRnrRetry; ++poll) EXPECT_EQ(*p.a.sendCq->poll(batch), 0);
  ASSERT_EQ(*p.a.sendCq->poll(batch), 1);
  EXPECT_EQ(batch[0].status, CompletionStatus::kRnrRetryExceeded);
  EXPECT_EQ(static_cast<int>(batch[0].status), 13);
  EXPECT_STREQ(completionStatusName(batch[0].status), "RNR retry counter exceeded");
  EXPECT_EQ(p.a.qp->state(), QueuePairState::kError);
}

TEST(VerbsModelRnr, NoRetriesFailsAtOnce) {
  Pair p = makePair({}, {}, 0);
  ASSERT_TRUE(p.a.qp->postWriteWithImm(1, p.a.local(0, 8), p.b.remote(0), 1, false).isOk());
  EXPECT_EQ(drain(*p.a.sendCq).at(0).status, CompletionStatus::kRnrRetryExceeded);
}

TEST(VerbsModelRnr, PeerDestroyedWhileWaitingIsRetryExceeded) {
  Pair p = makePair();
  ASSERT_TRUE(p.a.qp->postWriteWithImm(1, p.a.local(0, 8), p.b.remote(0), 1, true).isOk());
  EXPECT_TRUE(drain(*p.a.sendCq).empty());
  p.b.qp.reset();
  EXPECT_EQ(drain(*p.a.sendCq).at(0).status, CompletionStatus::kRetryExceeded);
}

TEST(VerbsModelQueues, CompletionQueueOverrunIsAnError) {
  Pair p = makePair({.cqEntries = 2});
  for (uint64_t wrId = 1; wrId <= 3; ++wrId)
    ASSERT_TRUE(p.a.qp->postWrite(wrId, p.a.local(0, 8), p.b.remote(0), true).isOk());
  std::array<Completion, 8> batch;
  Result<int> n = p.a.sendCq->poll(batch);
  ASSERT_FALSE(n.isOk());
  EXPECT_TRUE(contains(n.status().message(), "completion queue overrun")) << n.status().message();
  EXPECT_FALSE(p.a.sendCq->poll(batch).isOk()) << "an overrun queue is lost";
}

TEST(VerbsModelQueues, UnsignaledWritesHoldSendSlotsUntilASignaledOneIsPolled) {
  Pair p = makePair({.capacity = {4, 4}});
  for (uint64_t wrId = 1; wrId <= 3; ++wrId)
    ASSERT_TRUE(p.a.qp->postWrite(wrId, p.a.local(0, 8), p.b.remote(0), false).isOk());
  ASSERT_TRUE(p.a.qp->postWrite(4, p.a.local(0, 8), p.b.remote(0), true).isOk());
  Status full = p.a.qp->postWrite(5, p.a.local(0, 8), p.b.remote(0), true);
  EXPECT_TRUE(contains(full.message(), "send queue full")) << full.message();
  ASSERT_EQ(drain(*p.a.sendCq).size(), 1u);
  for (uint64_t wrId = 5; wrId <= 8; ++wrId)
    ASSERT_TRUE(p.a.qp->postWrite(wrId, p.a.local(0, 8), p.b.remote(0), false).isOk());
  EXPECT_FALSE(p.a.qp->postWrite(9, p.a.local(0, 8), p.b.remote(0), false).isOk());

  for (uint64_t wrId = 1; wrId <= 4; ++wrId) ASSERT_TRUE(p.a.qp->postRecv(wrId).isOk());
  Status recvFull = p.a.qp->postRecv(5);
  EXPECT_TRUE(contains(recvFull.message(), "receive queue full")) << recvFull.message();
}

TEST(VerbsModelStatus, NamesAreLibibverbsText) {
  EXPECT_STREQ(completionStatusName(CompletionStatus::kSuccess), "success");
  EXPECT_STREQ(completionStatusName(CompletionStatus::kLocalLengthError), "local length error");
  EXPECT_STREQ(completionStatusName(CompletionStatus::kLocalProtectionError),
               "local protection error");
  EXPECT_STREQ(completionStatusName(CompletionStatus::kWorkRequestFlushError),
               "Work Request Flushed Error");
  EXPECT_STREQ(completionStatusName(static_cast<CompletionStatus>(99)), "unknown");
}

// Two ranks on two threads, each posting and polling only its own queue
// pair: 1000 writes with immediate each way through 16 receive slots,
// with the receiver's reposted receives as the only flow control.
TEST(VerbsModelThreads, TwoThreadsExchangeAThousandMessagesEachWay) {
  constexpr int kMessages = 1000;
  constexpr int kSlots = 16;
  constexpr uint32_t kSlotBytes = 64;
  constexpr uint32_t kMaxSendWr = 64;
  constexpr size_t kStagingOffset = kSlots * kSlotBytes;
  EndpointOptions options{.capacity = {kMaxSendWr, kSlots},
                          .bytes = kStagingOffset + kMaxSendWr * kSlotBytes};
  Pair p = makePair(options, options);
  std::atomic<bool> failed{false};

  auto run = [&](Endpoint& self, const Endpoint& peer, uint8_t id) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (int i = 0; i < kSlots; ++i) ASSERT_TRUE(self.qp->postRecv(i).isOk());
    int sent = 0;
    int received = 0;
    int released = -1;  // the last message whose send slot came back
    std::array<Completion, 8> batch;
    while ((sent < kMessages || received < kMessages || released < kMessages - 1) && !failed) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "rank " << int{id} << " stuck: sent " << sent << ", received " << received
                      << ", released " << released;
        failed = true;
        return;
      }
      if (sent < kMessages && sent - released <= static_cast<int>(kMaxSendWr) - 1) {
        // A source buffer stays untouched until its work request is
        // released, so staging slots are as many as send slots.
        const size_t staging = kStagingOffset + (sent % kMaxSendWr) * kSlotBytes;
        std::memset(self.buffer.data() + staging, id, kSlotBytes);
        std::memcpy(self.buffer.data() + staging, &sent, sizeof(sent));
        const bool signaled = sent % 8 == 7 || sent == kMessages - 1;
        Status s =
            self.qp->postWriteWithImm(sent, self.local(staging, kSlotBytes),
                                      peer.remote((sent % kSlots) * kSlotBytes), sent, signaled);
        if (!s.isOk()) {
          ADD_FAILURE() << s.message();
          failed = true;
          return;
        }
        ++sent;
      }
      Result<int> n = self.recvCq->poll(batch);
      if (!n.isOk()) {
        ADD_FAILURE() << n.status().message();
        failed = true;
        return;
      }
      for (int i = 0; i < *n; ++i) {
        const Completion& c = batch[i];
        if (!c.ok() || c.imm != static_cast<uint32_t>(received) || c.byteLen != kSlotBytes) {
          ADD_FAILURE() << "rank " << int{id} << " message " << received << ": "
                        << completionStatusName(c.status) << ", imm " << c.imm;
          failed = true;
          return;
        }
        const uint8_t* slot = self.buffer.data() + (c.imm % kSlots) * kSlotBytes;
        int carried = -1;
        std::memcpy(&carried, slot, sizeof(carried));
        if (carried != received || slot[kSlotBytes - 1] != 1 - id) {
          ADD_FAILURE() << "rank " << int{id} << " slot holds message " << carried << ", not "
                        << received;
          failed = true;
          return;
        }
        ++received;
        ASSERT_TRUE(self.qp->postRecv(c.wrId).isOk());
      }
      n = self.sendCq->poll(batch);
      ASSERT_TRUE(n.isOk()) << n.status().message();
      for (int i = 0; i < *n; ++i) {
        EXPECT_TRUE(batch[i].ok()) << completionStatusName(batch[i].status);
        released = static_cast<int>(batch[i].wrId);
      }
    }
  };
  std::thread first([&] { run(p.a, p.b, 0); });
  std::thread second([&] { run(p.b, p.a, 1); });
  first.join();
  second.join();
  EXPECT_FALSE(failed);
}

}  // namespace
}  // namespace braid::ib
