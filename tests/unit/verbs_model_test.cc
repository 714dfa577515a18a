// The software model of the verbs: devices, memory, state machine, writes, access checks, reads.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "verbs_model_fixtures.h"

namespace braid::ib {
namespace {

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

}  // namespace
}  // namespace braid::ib
