// The CUDA-IPC transport's protocol (transports/cuda_ipc/cuda_ipc_connection.h)
// against the stand-in device of fake_ipc_device.h: two ends in this
// process, each with a device of its own, or two forked processes.
#include "transports/cuda_ipc/cuda_ipc_connection.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "cuda_ipc_pair.h"
#include "fake_ipc_device.h"
#include "transports/stream_connection.h"
#include "transports/tcp/socket_stream.h"

namespace braid::transport::cuda_ipc {
namespace {

// The stand-in frees memory as cudaFree does, after the work queued before
// it: a test that drops its buffers with copies still queued on them must
// not see a copy into unmapped memory.
TEST(FakeIpcDeviceMemory, FreeingWaitsForTheWorkQueuedBeforeIt) {
  FakeIpcDevice device;
  device.workDelay = std::chrono::milliseconds(20);
  auto from = std::make_unique<DeviceBuffer>(device, 4096);
  auto to = std::make_unique<DeviceBuffer>(device, 4096);
  from->fill(3);
  ASSERT_TRUE(device.enqueueCopy(to->data(), from->data(), 4096).isOk());
  to.reset();
  from.reset();
  EXPECT_TRUE(device.synchronize().isOk()) << device.synchronize().message();
  EXPECT_EQ(device.copies.load(), 1u);
}

TEST_F(CudaIpcPair, MessagesOfEverySizeArriveBothWays) {
  // Empty, under a slot, one slot exactly, and many slots (the 4 slots wrap
  // several times, so each is reused only after the peer drained it).
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{100}, size_t{4096}, size_t{4096 * 9 + 5}}) {
    SCOPED_TRACE(bytes);
    DeviceBuffer sa(*devA, bytes + 1), ra(*devA, bytes + 1), sb(*devB, bytes + 1),
        rb(*devB, bytes + 1);
    sa.fill(1);
    sb.fill(2);
    auto s1 = A->postSend(sa.data(), bytes, Tag{10 + bytes, 5});
    auto s2 = B->postSend(sb.data(), bytes, Tag{10 + bytes, 6});
    auto r1 = B->postRecv(rb.data(), bytes, Tag{10 + bytes, 5});
    auto r2 = A->postRecv(ra.data(), bytes, Tag{10 + bytes, 6});
    drive({s1, s2, r1, r2});
    for (const auto& r : {s1, s2, r1, r2})
      ASSERT_EQ(r->state(), State::kDone) << r->error().message();
    synchronize();
    EXPECT_EQ(std::memcmp(rb.data(), sa.data(), bytes), 0);
    EXPECT_EQ(std::memcmp(ra.data(), sb.data(), bytes), 0);
  }
  // The payload never went through host memory of the protocol: device copies only.
  EXPECT_GT(devA->copies.load(), 0u);
  EXPECT_GT(devB->copies.load(), 0u);
}

TEST_F(CudaIpcPair, ASlowDeviceNeverReadsASlotBeforeItIsFilledNorRefillsItEarly) {
  // With a slow stream on both ends, a missing wait (on filled before
  // reading a slot, or on drained before refilling it) corrupts some chunk.
  devA->workDelay = std::chrono::microseconds(200);
  devB->workDelay = std::chrono::microseconds(300);
  const size_t bytes = 4096 * 23 + 16;
  std::vector<std::unique_ptr<DeviceBuffer>> sends, recvs;
  std::vector<RequestPtr> requests;
  for (int m = 0; m < 4; ++m) {
    sends.push_back(std::make_unique<DeviceBuffer>(*devA, bytes));
    recvs.push_back(std::make_unique<DeviceBuffer>(*devB, bytes));
    sends.back()->fill(static_cast<uint8_t>(m * 31));
    requests.push_back(A->postSend(sends.back()->data(), bytes, Tag{uint64_t(100 + m), 1}));
    requests.push_back(B->postRecv(recvs.back()->data(), bytes, Tag{uint64_t(100 + m), 1}));
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (bool pending = true; pending && std::chrono::steady_clock::now() < until;) {
    (void)A->progress();
    (void)B->progress();
    pending = false;
    for (const auto& r : requests) pending = pending || r->state() == State::kPending;
  }
  for (const auto& r : requests) ASSERT_EQ(r->state(), State::kDone);
  synchronize();
  for (int m = 0; m < 4; ++m) EXPECT_TRUE(recvs[m]->holds(static_cast<uint8_t>(m * 31))) << m;
}

TEST_F(CudaIpcPair, ADoneSendWasOnlyQueuedTheDeviceFinishesIt) {
  // Completion means "queued on the device": with a slow device, the send
  // and the receive are done before the bytes have landed.
  devA->workDelay = std::chrono::milliseconds(20);
  DeviceBuffer s(*devA, 1000), r(*devB, 1000);
  s.fill(9);
  auto sent = A->postSend(s.data(), 1000, Tag{1, 1});
  auto got = B->postRecv(r.data(), 1000, Tag{1, 1});
  drive({sent, got});
  ASSERT_EQ(sent->state(), State::kDone);
  ASSERT_EQ(got->state(), State::kDone);
  synchronize();
  EXPECT_TRUE(r.holds(9));
}

TEST_F(CudaIpcPair, AMessageBeforeItsReceiveWaitsInItsSlots) {
  DeviceBuffer s(*devA, 3000), r(*devB, 3000);
  s.fill(4);
  auto sent = A->postSend(s.data(), 3000, Tag{7, 1});
  drive({sent});
  EXPECT_EQ(B->unclaimed(0, 8)->value, 7u);
  EXPECT_EQ(B->unclaimed(0, 8)->check, 1u);
  EXPECT_FALSE(B->unclaimed(0, 7).has_value());
  auto got = B->postRecv(r.data(), 3000, Tag{7, 1});
  drive({got});
  ASSERT_EQ(got->state(), State::kDone);
  synchronize();
  EXPECT_TRUE(r.holds(4));
  EXPECT_EQ(B->spilledChunks(), 0u);
}

TEST_F(CudaIpcPair, ReceivesInTheOtherOrderSpillHeldChunksAndBothComplete) {
  // The first message alone fills every slot of B; B receives the second
  // first. Without the spill the sender could never send the second.
  const size_t big = 4096 * 6, small = 500;
  DeviceBuffer s1(*devA, big), s2(*devA, small), r1(*devB, big), r2(*devB, small);
  s1.fill(1);
  s2.fill(2);
  auto a1 = A->postSend(s1.data(), big, Tag{1, 1});
  auto a2 = A->postSend(s2.data(), small, Tag{2, 1});
  auto b2 = B->postRecv(r2.data(), small, Tag{2, 1});
  drive({a1, a2, b2});
  ASSERT_EQ(b2->state(), State::kDone);
  EXPECT_GT(B->spilledChunks(), 0u);
  auto b1 = B->postRecv(r1.data(), big, Tag{1, 1});
  drive({b1});
  ASSERT_EQ(b1->state(), State::kDone);
  synchronize();
  EXPECT_TRUE(r1.holds(1));
  EXPECT_TRUE(r2.holds(2));
}

// A connection that spills call after call (a peer that runs ahead) reuses
// the memory of its earlier spills, whose copies are queued before any
// later spill's, rather than allocate anew each time and keep everything
// until it closes; nothing waits for the device between the rounds. A
// spilled message whose receive does not match gives its spill back too.
TEST_F(CudaIpcPair, SpillsReuseTheMemoryOfEarlierOnes) {
  constexpr int kRounds = 5;
  const size_t big = 4096 * 6, small = 500;
  DeviceBuffer s1(*devA, big), s2(*devA, small), wrong(*devB, big / 2);
  std::vector<std::unique_ptr<DeviceBuffer>> r1, r2;
  for (int round = 0; round < kRounds; ++round) {
    r1.push_back(std::make_unique<DeviceBuffer>(*devB, big));
    r2.push_back(std::make_unique<DeviceBuffer>(*devB, small));
  }
  s1.fill(10);
  s2.fill(20);
  size_t allocationsAfterFirst = 0;
  uint64_t tag = 1;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(round);
    const uint64_t first = tag;
    tag += 2;
    auto a1 = A->postSend(s1.data(), big, Tag{first, 1});
    auto a2 = A->postSend(s2.data(), small, Tag{first + 1, 1});
    auto b2 = B->postRecv(r2[round]->data(), small, Tag{first + 1, 1});
    drive({a1, a2, b2});
    auto b1 = B->postRecv(r1[round]->data(), big, Tag{first, 1});
    drive({b1});
    ASSERT_EQ(b1->state(), State::kDone);
    ASSERT_EQ(b2->state(), State::kDone);
    if (round == 0) allocationsAfterFirst = devB->unsharedAllocations;
  }
  // A spilled message refused by its receive (another size).
  auto a1 = A->postSend(s1.data(), big, Tag{tag, 1});
  auto a2 = A->postSend(s2.data(), small, Tag{tag + 1, 1});
  auto b2 = B->postRecv(r2[0]->data(), small, Tag{tag + 1, 1});
  drive({a1, a2, b2});
  const int mappedBefore = devB->liveMappings;
  auto refused = B->postRecv(wrong.data(), big / 2, Tag{tag, 1});
  drive({refused});
  EXPECT_EQ(refused->state(), State::kFailed);
  EXPECT_EQ(devB->liveMappings, mappedBefore);  // its spill kept, not freed
  synchronize();
  for (int round = 0; round < kRounds; ++round) {
    EXPECT_TRUE(r1[round]->holds(10)) << round;
    EXPECT_TRUE(r2[round]->holds(20)) << round;
  }
  EXPECT_GE(B->spilledChunks(), static_cast<size_t>(kRounds + 1));
  EXPECT_EQ(devB->unsharedAllocations, allocationsAfterFirst);
}

// A spill holds the chunks it copies out, a slot's worth each, never the
// whole message: a large message whose receive comes once its first chunks
// were spilled takes one round of spill blocks (a block per slot), and the
// rest of it goes straight from the slots into the receive.
TEST_F(CudaIpcPair, ASpillTakesAsMuchMemoryAsTheChunksItHolds) {
  const size_t big = 4096 * 40;
  DeviceBuffer s(*devA, big), r(*devB, big);
  for (size_t i = 0; i < big; ++i) s.data()[i] = static_cast<uint8_t>(i / 4096 + i);
  auto sent = A->postSend(s.data(), big, Tag{1, 1});
  const size_t bytesBefore = devB->unsharedBytes, exportedBefore = devB->allocations;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (B->spilledChunks() == 0 && std::chrono::steady_clock::now() < until) {
    (void)A->progress();
    (void)B->progress();
  }
  ASSERT_EQ(B->spilledChunks(), 4u);  // one round: every slot held
  auto got = B->postRecv(r.data(), big, Tag{1, 1});
  drive({sent, got});
  ASSERT_EQ(got->state(), State::kDone) << got->error().message();
  synchronize();
  EXPECT_EQ(std::memcmp(r.data(), s.data(), big), 0);
  EXPECT_EQ(B->spilledChunks(), 4u);
  EXPECT_EQ(devB->unsharedBytes - bytesBefore, 4 * 4096u);
  EXPECT_EQ(devB->allocations, exportedBefore);  // no peer opens spill blocks
}

// Chunks of several messages share a round of spill blocks: four messages
// of two slots each, held at once, spill in two rounds (one allocation
// each, the second once every block of the first holds a chunk), where a
// spill per message took four. Received last first, they free every
// block, and the same again allocates nothing.
TEST_F(CudaIpcPair, SpillRoundsAreAddedWhileEveryBlockHoldsAChunk) {
  constexpr int kHeld = 4;
  const size_t two = 4096 * 2, small = 100;
  std::vector<std::unique_ptr<DeviceBuffer>> sends;
  for (int m = 0; m <= kHeld; ++m) {
    sends.push_back(std::make_unique<DeviceBuffer>(*devA, m < kHeld ? two : small));
    sends.back()->fill(static_cast<uint8_t>(m + 1));
  }
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round);
    std::vector<std::unique_ptr<DeviceBuffer>> recvs;
    for (int m = 0; m <= kHeld; ++m)
      recvs.push_back(std::make_unique<DeviceBuffer>(*devB, m < kHeld ? two : small));
    const size_t allocationsBefore = devB->unsharedAllocations, bytesBefore = devB->unsharedBytes;
    const uint64_t first = 1 + (kHeld + 1) * static_cast<uint64_t>(round);
    std::vector<RequestPtr> sent;
    for (int m = 0; m <= kHeld; ++m)
      sent.push_back(A->postSend(sends[m]->data(), m < kHeld ? two : small, Tag{first + m, 1}));
    auto last = B->postRecv(recvs[kHeld]->data(), small, Tag{first + kHeld, 1});
    drive({sent[0], sent[1], sent[2], sent[3], sent[4], last});
    ASSERT_EQ(last->state(), State::kDone);
    EXPECT_EQ(B->spilledChunks(), 8u * (round + 1));
    EXPECT_EQ(devB->unsharedAllocations - allocationsBefore, round == 0 ? 2u : 0u);
    EXPECT_EQ(devB->unsharedBytes - bytesBefore, round == 0 ? 2 * 4 * 4096u : 0u);
    std::vector<RequestPtr> got;
    for (int m = kHeld - 1; m >= 0; --m)
      got.push_back(B->postRecv(recvs[m]->data(), two, Tag{first + m, 1}));
    drive({got[0], got[1], got[2], got[3]});
    for (const auto& r : got) ASSERT_EQ(r->state(), State::kDone);
    synchronize();
    for (int m = 0; m <= kHeld; ++m) EXPECT_TRUE(recvs[m]->holds(static_cast<uint8_t>(m + 1))) << m;
  }
}

// reserve() makes the first round of spill blocks ahead, once: the spills
// after it allocate nothing.
TEST_F(CudaIpcPair, ReserveMakesTheFirstSpillRoundAhead) {
  const size_t big = 4096 * 4, small = 500;
  DeviceBuffer s1(*devA, big), s2(*devA, small), r1(*devB, big), r2(*devB, small);
  const size_t allocationsBefore = devB->unsharedAllocations;
  ASSERT_TRUE(B->reserve({}, std::vector<size_t>{big}).isOk());
  EXPECT_EQ(devB->unsharedAllocations - allocationsBefore, 1u);
  ASSERT_TRUE(B->reserve(std::vector<size_t>{small}, {}).isOk());
  EXPECT_EQ(devB->unsharedAllocations - allocationsBefore, 1u);
  s1.fill(5);
  s2.fill(6);
  auto a1 = A->postSend(s1.data(), big, Tag{1, 1});
  auto a2 = A->postSend(s2.data(), small, Tag{2, 1});
  auto b2 = B->postRecv(r2.data(), small, Tag{2, 1});
  drive({a1, a2, b2});
  auto b1 = B->postRecv(r1.data(), big, Tag{1, 1});
  drive({b1});
  ASSERT_EQ(b1->state(), State::kDone);
  EXPECT_EQ(B->spilledChunks(), 4u);
  EXPECT_EQ(devB->unsharedAllocations - allocationsBefore, 1u);
  synchronize();
  EXPECT_TRUE(r1.holds(5));
  EXPECT_TRUE(r2.holds(6));
}

// A connection already dead spills nothing more: reserve() makes nothing.
TEST_F(CudaIpcPair, ADeadConnectionReservesNothing) {
  B->abort(Status(ErrorCode::kInternalError, "the test ends it"));
  const size_t allocationsBefore = devB->unsharedAllocations, exportedBefore = devB->allocations;
  EXPECT_TRUE(B->reserve({}, std::vector<size_t>{4096}).isOk());
  EXPECT_EQ(devB->unsharedAllocations, allocationsBefore);
  EXPECT_EQ(devB->allocations, exportedBefore);
}

// dst = local + incoming in 4-byte little-endian integers; notes any call
// given a part of an element.
struct IntAdder {
  mutable bool split = false;
  static void apply(void* dst, const void* local, const void* incoming, size_t units,
                    const void* context) {
    auto* d = static_cast<uint32_t*>(dst);
    const auto* l = static_cast<const uint32_t*>(local);
    const auto* in = static_cast<const uint32_t*>(incoming);
    static_cast<const IntAdder*>(context)->split |= reinterpret_cast<uintptr_t>(in) % 4 != 0;
    for (size_t i = 0; i < units; ++i) d[i] = l[i] + in[i];
  }
};

TEST_F(CudaIpcPair, AReceiveWithReductionCombinesOnTheDevice) {
  const size_t count = 1024 * 5 + 3, bytes = count * 4;
  DeviceBuffer s(*devA, bytes), local(*devB, bytes), dst(*devB, bytes);
  auto* sv = reinterpret_cast<uint32_t*>(s.data());
  auto* lv = reinterpret_cast<uint32_t*>(local.data());
  for (size_t i = 0; i < count; ++i) sv[i] = static_cast<uint32_t>(i * 3), lv[i] = 1000000;
  IntAdder adder;
  Combiner combiner{4, &IntAdder::apply, &adder};
  auto sent = A->postSend(s.data(), bytes, Tag{3, 2});
  auto got = B->postRecvReduce(dst.data(), local.data(), bytes, Tag{3, 2}, combiner);
  drive({sent, got});
  ASSERT_EQ(got->state(), State::kDone);
  synchronize();
  auto* dv = reinterpret_cast<uint32_t*>(dst.data());
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(dv[i], 1000000 + i * 3) << i;
  EXPECT_FALSE(adder.split);
  EXPECT_EQ(devB->combines.load(), 6u);  // one per chunk
}

TEST_F(CudaIpcPair, AMessageOfAnotherSizeOrCallFailsTheReceiveNotTheConnection) {
  DeviceBuffer s(*devA, 8192), r(*devB, 8192);
  s.fill(3);
  auto wrongSize = A->postSend(s.data(), 8192, Tag{1, 1});
  auto small = B->postRecv(r.data(), 100, Tag{1, 1});
  drive({wrongSize, small});
  EXPECT_EQ(small->state(), State::kFailed);
  EXPECT_EQ(small->error().code(), ErrorCode::kInvalidUsage);
  EXPECT_EQ(small->failure(), Request::Failure::kDifferentCall);

  auto wrongCall = A->postSend(s.data(), 64, Tag{2, 99});
  drive({wrongCall});
  auto other = B->postRecv(r.data(), 64, Tag{2, 1});
  EXPECT_EQ(other->state(), State::kFailed);
  EXPECT_EQ(other->failure(), Request::Failure::kDifferentCall);
  EXPECT_EQ(other->mismatch().check, 99u);

  // The refused message's slots came back: a later one of every slot passes.
  auto next = A->postSend(s.data(), 8192, Tag{3, 1});
  auto fine = B->postRecv(r.data(), 8192, Tag{3, 1});
  drive({next, fine});
  ASSERT_EQ(fine->state(), State::kDone) << fine->error().message();
  synchronize();
  EXPECT_TRUE(r.holds(3));
}

TEST_F(CudaIpcPair, AReceiveThePeerMovedPastFailsAsOvertaken) {
  DeviceBuffer s(*devA, 64), r(*devB, 64);
  auto late = A->postSend(s.data(), 64, Tag{5, 1});
  drive({late});
  (void)B->progress();
  auto early = B->postRecv(r.data(), 64, Tag{4, 1});
  EXPECT_EQ(early->state(), State::kFailed);
  EXPECT_EQ(early->failure(), Request::Failure::kOvertaken);
  synchronize();
}

TEST_F(CudaIpcPair, ADeviceThatRefusesWorkFailsTheRequestsWithItsError) {
  DeviceBuffer s(*devA, 64);
  devA->failEnqueues = true;
  auto sent = A->postSend(s.data(), 64, Tag{1, 1});
  drive({sent});
  EXPECT_EQ(sent->state(), State::kFailed);
  EXPECT_EQ(sent->error().code(), ErrorCode::kUnhandledCudaError);
  EXPECT_NE(sent->error().message().find("enqueue refused"), std::string::npos);
  // The peer learns the connection ended.
  DeviceBuffer r(*devB, 64);
  auto got = B->postRecv(r.data(), 64, Tag{1, 1});
  drive({got});
  EXPECT_EQ(got->state(), State::kFailed);
}

TEST_F(CudaIpcPair, AbortFailsWhatIsPendingOnBothEnds) {
  DeviceBuffer r(*devA, 64), r2(*devB, 64);
  auto mine = A->postRecv(r.data(), 64, Tag{1, 1});
  auto theirs = B->postRecv(r2.data(), 64, Tag{1, 1});
  A->abort(remoteError("test abort"));
  EXPECT_EQ(mine->state(), State::kFailed);
  drive({theirs});
  EXPECT_EQ(theirs->state(), State::kFailed);
  EXPECT_FALSE(A->postSend(r.data(), 64, Tag{2, 1})->state() == State::kPending);
}

// A job that fails names its call to the peer (abortInCall), which then
// tells a failure of a later call than its own from one of the same call.
TEST_F(CudaIpcPair, AnAbortInACallNamesTheCallToThePeer) {
  constexpr uint64_t kMark = (uint64_t{3} << 56) | 77;
  DeviceBuffer from(*devA, 64), to(*devB, 64);
  auto sent = A->postSend(from.data(), 64, Tag{1, 1});
  auto received = B->postRecv(to.data(), 64, Tag{1, 1});
  drive({sent, received});  // an earlier call that completed
  A->abortInCall(Status(ErrorCode::kInternalError, "test abort"), kMark);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (B->peerFailure().isOk() && std::chrono::steady_clock::now() < until) (void)B->progress();
  ASSERT_FALSE(B->peerFailure().isOk());
  EXPECT_EQ(B->peerFailedCall(), kMark);
}

TEST_F(CudaIpcPair, ClosingReleasesEveryMappingAndEvent) {
  DeviceBuffer s(*devA, 20000), r(*devB, 20000);
  s.fill(5);
  auto sent = A->postSend(s.data(), 20000, Tag{1, 1});
  auto got = B->postRecv(r.data(), 20000, Tag{1, 1});
  drive({sent, got});
  A.reset();
  B.reset();
  EXPECT_TRUE(r.holds(5));  // the destructor waited for the queued copies
  // Only the two test buffers are left.
  EXPECT_EQ(devA->liveMappings.load(), 1);
  EXPECT_EQ(devB->liveMappings.load(), 1);
}

TEST(CudaIpcOptions, SlotsOutsideTheLimitsAreRefused) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  auto device = std::make_shared<FakeIpcDevice>();
  auto tooMany = CudaIpcConnection::create(controlEnd(fds[0], 1), device, smallSlots(17));
  EXPECT_EQ(tooMany.status().code(), ErrorCode::kInvalidArgument);
  auto odd = CudaIpcConnection::create(controlEnd(fds[1], 0), device, smallSlots(4, 1000));
  EXPECT_EQ(odd.status().code(), ErrorCode::kInvalidArgument);
}

TEST(CudaIpcShared, RecordsShareTheHostConnectionWithItsOwnMessages) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  auto hostA = controlEnd(fds[0], 1), hostB = controlEnd(fds[1], 0);
  auto devA = std::make_shared<FakeIpcDevice>(), devB = std::make_shared<FakeIpcDevice>();
  auto a = CudaIpcConnection::createShared(*hostA, 0xfe, devA, smallSlots());
  auto b = CudaIpcConnection::createShared(*hostB, 0xfe, devB, smallSlots());
  ASSERT_TRUE(a.isOk() && b.isOk());
  DeviceBuffer s(*devA, 30000), r(*devB, 30000);
  s.fill(6);
  std::vector<uint8_t> hostIn(5000, 0), hostOut(5000, 42);
  // Host messages in channel 0 and GPU messages with the same tag values.
  auto hs = hostA->postSend(hostOut.data(), hostOut.size(), Tag{1, 1});
  auto gs = (*a)->postSend(s.data(), 30000, Tag{1, 1});
  auto gr = (*b)->postRecv(r.data(), 30000, Tag{1, 1});
  auto hr = hostB->postRecv(hostIn.data(), hostIn.size(), Tag{1, 1});
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (bool pending = true; pending && std::chrono::steady_clock::now() < until;) {
    (void)(*a)->progress();
    (void)(*b)->progress();
    pending = false;
    for (const auto& q : {hs, gs, gr, hr}) pending = pending || q->state() == State::kPending;
  }
  for (const auto& q : {hs, gs, gr, hr}) ASSERT_EQ(q->state(), State::kDone);
  EXPECT_TRUE(devB->synchronize().isOk());
  EXPECT_TRUE(r.holds(6));
  EXPECT_EQ(hostIn, hostOut);
  // Nothing of the records is left for the host's own calls to find.
  EXPECT_FALSE(hostB->unclaimed(0, ~uint64_t{0} >> 8).has_value());
  a->reset();
  b->reset();
}

// Two processes, each with its own stand-in device: the handles cross a
// process boundary, as CUDA IPC handles do.
TEST(CudaIpcProcesses, TwoProcessesExchangeAndReduce) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  int done[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, done), 0);
  const size_t count = 50000, bytes = count * 4;
  auto side = [&](int rank) -> int {
    auto device = std::make_shared<FakeIpcDevice>();
    auto c =
        CudaIpcConnection::create(controlEnd(fds[rank], 1 - rank), device, smallSlots(3, 8192));
    if (!c.isOk()) return 10;
    DeviceBuffer mine(*device, bytes), theirs(*device, bytes), sum(*device, bytes);
    auto* m = reinterpret_cast<uint32_t*>(mine.data());
    for (size_t i = 0; i < count; ++i) m[i] = static_cast<uint32_t>(i + rank * 7);
    IntAdder adder;
    auto s = (*c)->postSend(mine.data(), bytes, Tag{1, 1});
    auto r = (*c)->postRecv(theirs.data(), bytes, Tag{1, 1});
    auto s2 = (*c)->postSend(mine.data(), bytes, Tag{2, 1});
    auto r2 = (*c)->postRecvReduce(sum.data(), mine.data(), bytes, Tag{2, 1},
                                   Combiner{4, &IntAdder::apply, &adder});
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (bool pending = true; pending;) {
      if (std::chrono::steady_clock::now() > until) return 11;
      if (!(*c)->progress().isOk()) return 12;
      pending = false;
      for (const auto& q : {s, r, s2, r2}) pending = pending || q->state() == State::kPending;
    }
    if (!device->synchronize().isOk()) return 13;
    auto* t = reinterpret_cast<uint32_t*>(theirs.data());
    auto* u = reinterpret_cast<uint32_t*>(sum.data());
    for (size_t i = 0; i < count; ++i) {
      if (t[i] != i + (1 - rank) * 7) return 14;
      if (u[i] != 2 * i + 7) return 15;
    }
    // Both ends stay, progressing, until both are done: the last credits
    // are still on their way, and a mapping of the peer's memory must not
    // outlive the peer's copies into it.
    (void)!::write(done[rank], "x", 1);
    pollfd other{done[rank], POLLIN, 0};
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    // Errors are no news here: the peer may be gone already, after its byte.
    while (::poll(&other, 1, 0) == 0 && std::chrono::steady_clock::now() < giveUp)
      (void)(*c)->progress();
    char byte;
    return ::read(done[rank], &byte, 1) == 1 ? 0 : 16;
  };
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(side(1));
  EXPECT_EQ(side(0), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace braid::transport::cuda_ipc
