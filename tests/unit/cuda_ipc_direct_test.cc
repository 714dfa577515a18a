// Reads in place (transports/cuda_ipc/cuda_ipc_connection.h): a large
// message's receiver reads it out of the sender's buffer, against the
// stand-in device. Each test could fail: the copy counts say which way the
// bytes went, and slow devices expose a missing wait as corrupt bytes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "cuda_ipc_pair.h"
#include "fake_ipc_device.h"
#include "transports/cuda_ipc/cuda_ipc_connection.h"

namespace braid::transport::cuda_ipc {
namespace {

constexpr size_t kDirectMin = 1024;
constexpr size_t kLarge = 4096 * 9 + 4;  // more than the 4 slots of 4 KiB hold

class DirectPair : public CudaIpcPair {
 protected:
  void SetUp() override {
    auto options = smallSlots();
    options.directMinBytes = kDirectMin;
    open(options);
  }
  // One small message each way is through: the handshake, which opens the
  // peer's slots, is done.
  void handshake() {
    DeviceBuffer from(*devA, 16), to(*devB, 16);
    auto sent = A->postSend(from.data(), 16, Tag{1, 1});
    auto got = B->postRecv(to.data(), 16, Tag{1, 1});
    drive({sent, got});
    synchronize();
  }
  // Drives both ends for `ms` milliseconds, whatever is pending.
  void driveFor(int ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
      (void)A->progress();
      (void)B->progress();
    }
  }
};

// dst = local + incoming, in 4-byte integers.
void addInts(void* dst, const void* local, const void* incoming, size_t units, const void*) {
  auto* d = static_cast<uint32_t*>(dst);
  const auto* l = static_cast<const uint32_t*>(local);
  const auto* in = static_cast<const uint32_t*>(incoming);
  for (size_t i = 0; i < units; ++i) d[i] = l[i] + in[i];
}

TEST_F(DirectPair, ALargeMessageIsReadInPlaceWithOneCopy) {
  DeviceBuffer s(*devA, kLarge + 64), r(*devB, kLarge);
  s.fill(7);
  // From inside its allocation: the offset travels with the handle.
  auto sent = A->postSend(s.data() + 64, kLarge, Tag{5, 1});
  auto got = B->postRecv(r.data(), kLarge, Tag{5, 1});
  drive({sent, got});
  ASSERT_EQ(sent->state(), State::kDone) << sent->error().message();
  ASSERT_EQ(got->state(), State::kDone) << got->error().message();
  synchronize();
  EXPECT_EQ(std::memcmp(r.data(), s.data() + 64, kLarge), 0);
  EXPECT_EQ(B->directReads(), 1u);
  EXPECT_EQ(devA->copies.load(), 0u);  // the sender copied nothing into a slot
  EXPECT_EQ(devB->copies.load(), 1u);  // the receiver read it once, whole
}

TEST_F(DirectPair, MessagesUnderTheMinimumGoThroughTheSlots) {
  DeviceBuffer s(*devA, kDirectMin - 4), r(*devB, kDirectMin - 4);
  s.fill(3);
  auto sent = A->postSend(s.data(), s.bytes, Tag{5, 1});
  auto got = B->postRecv(r.data(), r.bytes, Tag{5, 1});
  drive({sent, got});
  ASSERT_EQ(got->state(), State::kDone);
  synchronize();
  EXPECT_TRUE(r.holds(3));
  EXPECT_EQ(B->directReads(), 0u);
  EXPECT_EQ(devA->exports.load(), 0u);
}

TEST_F(DirectPair, AReceiveWithReductionCombinesStraightFromThePeersBuffer) {
  const size_t count = kLarge / 4;
  DeviceBuffer s(*devA, kLarge), local(*devB, kLarge), dst(*devB, kLarge);
  auto* sv = reinterpret_cast<uint32_t*>(s.data());
  auto* lv = reinterpret_cast<uint32_t*>(local.data());
  for (size_t i = 0; i < count; ++i) sv[i] = static_cast<uint32_t>(i * 3), lv[i] = 1000000;
  auto sent = A->postSend(s.data(), kLarge, Tag{3, 2});
  auto got = B->postRecvReduce(dst.data(), local.data(), kLarge, Tag{3, 2},
                               Combiner{4, &addInts, nullptr});
  drive({sent, got});
  ASSERT_EQ(got->state(), State::kDone);
  synchronize();
  auto* dv = reinterpret_cast<uint32_t*>(dst.data());
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(dv[i], 1000000 + i * 3) << i;
  EXPECT_EQ(devB->combines.load(), 1u);  // one combination, no chunks
  EXPECT_EQ(devB->copies.load(), 0u);
}

TEST_F(DirectPair, ASendEndsOnlyOnceItsReceiveIsPostedAndIsThenRead) {
  DeviceBuffer s(*devA, kLarge), r(*devB, kLarge);
  s.fill(9);
  auto sent = A->postSend(s.data(), kLarge, Tag{8, 4});
  driveFor(50);
  EXPECT_EQ(sent->state(), State::kPending);  // a rendezvous: nobody read it yet
  auto got = B->postRecv(r.data(), kLarge, Tag{8, 4});
  drive({sent, got});
  ASSERT_EQ(sent->state(), State::kDone);
  ASSERT_EQ(got->state(), State::kDone);
  synchronize();
  EXPECT_TRUE(r.holds(9));
  EXPECT_EQ(B->directReads(), 1u);
}

TEST_F(DirectPair, TheReadWaitsForTheSendersEarlierWork) {
  // The sender's device is slow and fills the buffer just before the send:
  // a read that did not wait for the sender's ready event would get zeros.
  DeviceBuffer filled(*devA, kLarge), s(*devA, kLarge), r(*devB, kLarge);
  filled.fill(21);
  std::memset(s.data(), 0, kLarge);
  devA->workDelay = std::chrono::milliseconds(30);
  ASSERT_TRUE(devA->enqueueCopy(s.data(), filled.data(), kLarge).isOk());
  auto got = B->postRecv(r.data(), kLarge, Tag{2, 2});
  auto sent = A->postSend(s.data(), kLarge, Tag{2, 2});
  drive({sent, got});
  synchronize();
  EXPECT_TRUE(r.holds(21));
  EXPECT_EQ(B->directReads(), 1u);
}

TEST_F(DirectPair, TheSendersLaterWorkWaitsForThePeersRead) {
  // The receiver's device is slow: once the send is done, the sender's own
  // device overwrites the buffer. Without the wait on the peer's read
  // event, the receiver would read the new bytes.
  DeviceBuffer s(*devA, kLarge), other(*devA, kLarge), r(*devB, kLarge);
  s.fill(4);
  other.fill(99);
  devB->workDelay = std::chrono::milliseconds(30);
  auto sent = A->postSend(s.data(), kLarge, Tag{6, 1});
  auto got = B->postRecv(r.data(), kLarge, Tag{6, 1});
  drive({sent, got});
  ASSERT_EQ(sent->state(), State::kDone);
  ASSERT_TRUE(devA->enqueueCopy(s.data(), other.data(), kLarge).isOk());
  synchronize();
  EXPECT_TRUE(r.holds(4));
  EXPECT_TRUE(s.holds(99));
}

TEST_F(DirectPair, MessagesPastTheReadIndicesGoThroughTheSlots) {
  constexpr int kMessages = static_cast<int>(CudaIpcConnection::kDirectReads) * 2 + 3;
  std::vector<std::unique_ptr<DeviceBuffer>> sends, recvs;
  std::vector<RequestPtr> requests;
  for (int m = 0; m < kMessages; ++m) {
    sends.push_back(std::make_unique<DeviceBuffer>(*devA, kLarge));
    recvs.push_back(std::make_unique<DeviceBuffer>(*devB, kLarge));
    sends.back()->fill(static_cast<uint8_t>(m));
    requests.push_back(A->postSend(sends.back()->data(), kLarge, Tag{uint64_t(100 + m), 1}));
  }
  // Received in reverse order, so the early messages wait unexpected.
  for (int m = kMessages - 1; m >= 0; --m)
    requests.push_back(B->postRecv(recvs[m]->data(), kLarge, Tag{uint64_t(100 + m), 1}));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (bool pending = true; pending && std::chrono::steady_clock::now() < until;) {
    (void)A->progress();
    (void)B->progress();
    pending = false;
    for (const auto& q : requests) pending = pending || q->state() == State::kPending;
  }
  for (const auto& q : requests) ASSERT_EQ(q->state(), State::kDone) << q->error().message();
  synchronize();
  for (int m = 0; m < kMessages; ++m) EXPECT_TRUE(recvs[m]->holds(static_cast<uint8_t>(m))) << m;
  // The one past the read indices went through the slots, the sender not
  // waiting for an index (later ones found indices answered again).
  EXPECT_GE(B->directReads(), static_cast<size_t>(CudaIpcConnection::kDirectReads));
  EXPECT_LT(B->directReads(), static_cast<size_t>(kMessages));
}

TEST_F(DirectPair, EachAllocationOfThePeerIsOpenedOnce) {
  handshake();
  DeviceBuffer s(*devA, 2 * kLarge), r(*devB, 2 * kLarge);
  s.fill(5);
  int opens = 0;
  devB->beforeOpen = [&] {
    ++opens;
    return Status::ok();
  };
  auto s1 = A->postSend(s.data(), kLarge, Tag{2, 1});
  auto s2 = A->postSend(s.data() + kLarge, kLarge, Tag{3, 1});
  auto r1 = B->postRecv(r.data(), kLarge, Tag{2, 1});
  auto r2 = B->postRecv(r.data() + kLarge, kLarge, Tag{3, 1});
  drive({s1, s2, r1, r2});
  synchronize();
  EXPECT_TRUE(r.holds(5));
  EXPECT_EQ(B->directReads(), 2u);
  EXPECT_EQ(opens, 1);
}

// Past the allocations a receiver keeps open, a message from one more goes
// through the slots, and those open already are still read in place.
TEST_F(DirectPair, PastTheOpenAllocationsAnotherGoesThroughTheSlotsAndOpenOnesAreStillRead) {
  handshake();
  DeviceBuffer r(*devB, kDirectMin);
  uint64_t tag = 2;
  auto exchange = [&](DeviceBuffer& s, uint8_t seed) {
    s.fill(seed);
    auto sent = A->postSend(s.data(), s.bytes, Tag{tag, 1});
    auto got = B->postRecv(r.data(), r.bytes, Tag{tag++, 1});
    drive({sent, got});
    synchronize();
    return sent->state() == State::kDone && got->state() == State::kDone && r.holds(seed);
  };
  std::vector<std::unique_ptr<DeviceBuffer>> sources;
  for (size_t i = 0; i <= CudaIpcConnection::kMaxPeerAllocations; ++i) {
    sources.push_back(std::make_unique<DeviceBuffer>(*devA, kDirectMin));
    ASSERT_TRUE(exchange(*sources.back(), static_cast<uint8_t>(i))) << i;
  }
  EXPECT_EQ(B->directReads(), CudaIpcConnection::kMaxPeerAllocations);
  ASSERT_TRUE(exchange(*sources.front(), 99));
  EXPECT_EQ(B->directReads(), CudaIpcConnection::kMaxPeerAllocations + 1);
}

TEST_F(DirectPair, ABufferTheDeviceCannotExportGoesThroughTheSlots) {
  devA->refuseExports = true;
  DeviceBuffer s(*devA, kLarge), r(*devB, kLarge);
  s.fill(12);
  auto sent = A->postSend(s.data(), kLarge, Tag{4, 1});
  auto got = B->postRecv(r.data(), kLarge, Tag{4, 1});
  drive({sent, got});
  ASSERT_EQ(got->state(), State::kDone);
  synchronize();
  EXPECT_TRUE(r.holds(12));
  EXPECT_EQ(B->directReads(), 0u);
  EXPECT_GT(devA->copies.load(), 1u);  // chunk by chunk into the slots
}

TEST_F(DirectPair, AReceiverThatCannotOpenTheBufferHasItSentThroughTheSlots) {
  handshake();
  devB->beforeOpen = [] { return notSupported("fake device: no peer access"); };
  DeviceBuffer s1(*devA, kLarge), s2(*devA, kLarge), s3(*devA, kLarge), r1(*devB, kLarge),
      r2(*devB, kLarge), r3(*devB, kLarge);
  s1.fill(31);
  s2.fill(32);
  s3.fill(33);
  // The first is posted when it arrives; the second only later, so it is
  // refused while unexpected; the third goes through the slots from the start.
  auto got1 = B->postRecv(r1.data(), kLarge, Tag{2, 1});
  auto sent1 = A->postSend(s1.data(), kLarge, Tag{2, 1});
  auto sent2 = A->postSend(s2.data(), kLarge, Tag{3, 1});
  driveFor(30);
  auto got2 = B->postRecv(r2.data(), kLarge, Tag{3, 1});
  auto sent3 = A->postSend(s3.data(), kLarge, Tag{4, 1});
  auto got3 = B->postRecv(r3.data(), kLarge, Tag{4, 1});
  drive({sent1, sent2, sent3, got1, got2, got3});
  for (const auto& q : {sent1, sent2, sent3, got1, got2, got3})
    ASSERT_EQ(q->state(), State::kDone) << q->error().message();
  synchronize();
  EXPECT_TRUE(r1.holds(31));
  EXPECT_TRUE(r2.holds(32));
  EXPECT_TRUE(r3.holds(33));
  EXPECT_EQ(B->directReads(), 0u);
  EXPECT_LE(devA->exports.load(), 2u);  // not the third: the peer said it cannot
}

// While a CUDA stream may wait for a call, nothing opens a peer's memory or
// exports this process's (they take the driver's memory lock): such a
// message goes through the slots, its allocation is opened at the next
// reserve(), which runs before a stream waits, and its buffer read in place
// from then on; one opened meanwhile by a later message is not opened again.
class DirectWhenAllowed : public CudaIpcPair {
 protected:
  void SetUp() override {
    auto options = smallSlots();
    options.directMinBytes = kDirectMin;
    options.ifMayMap = [allowed = allowed](const std::function<void()>& work) {
      if (!allowed->load()) return false;
      work();
      return true;
    };
    open(options);
    devB->beforeOpen = [opens = opens] {
      ++*opens;
      return Status::ok();
    };
  }
  // Sends `s` from A to B as message `tag`; true if it arrived whole.
  bool exchange(DeviceBuffer& s, DeviceBuffer& r, uint64_t tag, uint8_t seed) {
    s.fill(seed);
    std::memset(r.data(), 0, r.bytes);
    auto sent = A->postSend(s.data(), s.bytes, Tag{tag, 1});
    auto got = B->postRecv(r.data(), r.bytes, Tag{tag, 1});
    drive({sent, got});
    synchronize();
    return got->state() == State::kDone && r.holds(seed);
  }
  std::shared_ptr<std::atomic<bool>> allowed = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<int>> opens = std::make_shared<std::atomic<int>>(0);
};

TEST_F(DirectWhenAllowed, AnAllocationNotOpenableNowIsOpenedAtTheNextReserve) {
  DeviceBuffer s(*devA, kLarge), r(*devB, kLarge);
  // The sender may export now; the receiver may not open.
  ASSERT_TRUE(devA->exportRange(s.data(), s.bytes).isOk());
  EXPECT_TRUE(exchange(s, r, 2, 41));
  EXPECT_EQ(B->directReads(), 0u);  // declined: through the slots
  const int slotOpens = opens->load();
  ASSERT_TRUE(B->reserve({}, {}).isOk());
  EXPECT_EQ(opens->load(), slotOpens + 1);  // the sender's allocation, opened now
  EXPECT_TRUE(exchange(s, r, 3, 42));
  EXPECT_EQ(B->directReads(), 1u);  // read in place, still without mapping now
  EXPECT_EQ(opens->load(), slotOpens + 1);
}

TEST_F(DirectWhenAllowed, OneOpenedMeanwhileIsNotOpenedAgainAtReserve) {
  DeviceBuffer s(*devA, kLarge), r(*devB, kLarge);
  ASSERT_TRUE(devA->exportRange(s.data(), s.bytes).isOk());
  EXPECT_TRUE(exchange(s, r, 2, 51));  // declined, its allocation left to reserve()
  allowed->store(true);
  const int slotOpens = opens->load();
  EXPECT_TRUE(exchange(s, r, 3, 52));  // opened as it arrives
  EXPECT_EQ(B->directReads(), 1u);
  ASSERT_TRUE(B->reserve({}, {}).isOk());
  EXPECT_EQ(opens->load(), slotOpens + 1);
}

// An allocation opened late fails as one its owner freed meanwhile would
// (its descriptor withdrawn): that one is dropped, and the peer's other
// allocations are still read in place.
TEST_F(DirectWhenAllowed, AnAllocationGoneBeforeItsLateOpenIsDroppedAlone) {
  DeviceBuffer gone(*devA, kLarge), kept(*devA, kLarge), r(*devB, kLarge);
  ASSERT_TRUE(devA->exportRange(gone.data(), gone.bytes).isOk());
  ASSERT_TRUE(devA->exportRange(kept.data(), kept.bytes).isOk());
  EXPECT_TRUE(exchange(gone, r, 2, 71));  // declined, left to reserve()
  devB->beforeOpen = [] { return remoteError("fake: the descriptor was withdrawn"); };
  ASSERT_TRUE(B->reserve({}, {}).isOk());
  devB->beforeOpen = nullptr;
  allowed->store(true);
  EXPECT_TRUE(exchange(kept, r, 3, 72));
  EXPECT_EQ(B->directReads(), 1u);
}

// Its owner frees a held allocation while the peer's reserve() opens it: the
// peer unmaps it there and then, rather than keep it.
TEST_F(DirectWhenAllowed, AnAllocationFreedWhileItOpensIsUnmappedAtOnce) {
  devA->heldExports = true;
  DeviceBuffer s(*devA, kLarge), r(*devB, kLarge);
  ASSERT_TRUE(B->reserve({}, {}).isOk());  // its spill blocks, made once
  EXPECT_TRUE(exchange(s, r, 2, 91));      // declined, left to reserve()
  const int mapped = devB->liveMappings.load();
  devB->beforeOpen = [&] {
    devA->reportHeldFreed(s.data());
    for (int i = 0; i < 20; ++i) (void)A->progress(), (void)B->progress();
    return Status::ok();
  };
  int openCalls = 0;
  devB->beforeOpen = [&, tell = devB->beforeOpen] {
    ++openCalls;
    return tell();
  };
  ASSERT_TRUE(B->reserve({}, {}).isOk());  // opened, then unmapped: never read
  devB->beforeOpen = nullptr;
  EXPECT_EQ(openCalls, 1);
  EXPECT_EQ(devB->liveMappings.load(), mapped);
}

TEST_F(DirectWhenAllowed, ABufferNotExportedGoesThroughTheSlotsUntilItIs) {
  DeviceBuffer s(*devA, kLarge), r(*devB, kLarge);
  EXPECT_TRUE(exchange(s, r, 2, 61));
  EXPECT_EQ(devA->exports.load(), 0u);  // not exported during the call
  EXPECT_EQ(B->directReads(), 0u);
  // As the communicator does before a call's CUDA stream waits.
  ASSERT_TRUE(devA->exportRange(s.data(), s.bytes).isOk());
  ASSERT_TRUE(B->reserve({}, {}).isOk());  // nothing pending: the record never came
  allowed->store(true);
  EXPECT_TRUE(exchange(s, r, 3, 62));
  EXPECT_EQ(B->directReads(), 1u);
}

// As by default (BRAID_CUDA_IPC_DIRECT_BYTES=auto): only buffers whose
// memory a peer's mapping keeps alive (braidMemAlloc's) are read in place,
// from their own minimum, and no other buffer is exported for it.
class HeldDirectPair : public DirectPair {
 protected:
  void SetUp() override {
    auto options = smallSlots();
    options.heldDirectMinBytes = kDirectMin;
    open(options);
  }
  // Sends `bytes` from A to B; true if they arrived whole.
  bool exchange(size_t bytes, uint8_t seed) {
    DeviceBuffer s(*devA, bytes), r(*devB, bytes);
    s.fill(seed);
    auto sent = A->postSend(s.data(), bytes, Tag{++tag_, 1});
    auto got = B->postRecv(r.data(), bytes, Tag{tag_, 1});
    drive({sent, got});
    synchronize();
    return sent->state() == State::kDone && got->state() == State::kDone && r.holds(seed);
  }
  uint64_t tag_ = 1;
};

TEST_F(HeldDirectPair, AHeldBufferIsReadInPlaceWithoutAnExportDuringTheCall) {
  devA->heldExports = true;
  EXPECT_TRUE(exchange(kLarge, 71));
  EXPECT_EQ(B->directReads(), 1u);
  EXPECT_EQ(devA->copies.load(), 0u);
  EXPECT_EQ(devA->exports.load(), 0u);
}

TEST_F(HeldDirectPair, OtherBuffersGoThroughTheSlotsAndAreNotExported) {
  EXPECT_TRUE(exchange(kLarge, 72));
  EXPECT_EQ(B->directReads(), 0u);
  EXPECT_GT(devA->copies.load(), 0u);
  EXPECT_EQ(devA->exports.load(), 0u);
}

TEST_F(HeldDirectPair, HeldBuffersUnderTheirMinimumGoThroughTheSlots) {
  devA->heldExports = true;
  EXPECT_TRUE(exchange(kDirectMin - 4, 73));
  EXPECT_EQ(B->directReads(), 0u);
  EXPECT_TRUE(exchange(kDirectMin, 74));
  EXPECT_EQ(B->directReads(), 1u);
}

// A buffer exported already (as with BRAID_CUDA_IPC_DIRECT_BYTES set before)
// whose memory the peer does not hold is still not read in place.
TEST_F(HeldDirectPair, ABufferExportedBeforeButNotHeldGoesThroughTheSlots) {
  DeviceBuffer s(*devA, kLarge), r(*devB, kLarge);
  ASSERT_TRUE(devA->exportRange(s.data(), s.bytes).isOk());
  s.fill(75);
  auto sent = A->postSend(s.data(), kLarge, Tag{2, 1});
  auto got = B->postRecv(r.data(), kLarge, Tag{2, 1});
  drive({sent, got});
  synchronize();
  EXPECT_TRUE(r.holds(75));
  EXPECT_EQ(B->directReads(), 0u);
}

// The owner frees a held allocation: its peer is told, and unmaps it at its
// next reserve(), its read done; one still in use stays mapped.
TEST_F(HeldDirectPair, AFreedAllocationIsUnmappedByThePeerAtItsNextReserve) {
  devA->heldExports = true;
  handshake();
  ASSERT_TRUE(B->reserve({}, {}).isOk());  // its spill blocks, made once
  const int mapped = devB->liveMappings.load();
  EXPECT_TRUE(exchange(kLarge, 81));  // its buffers are freed as it returns
  EXPECT_EQ(B->directReads(), 1u);
  EXPECT_EQ(devB->liveMappings.load(), mapped + 1);  // the peer's allocation, open
  driveFor(20);
  ASSERT_TRUE(B->reserve({}, {}).isOk());
  EXPECT_EQ(devB->liveMappings.load(), mapped);
}

TEST_F(HeldDirectPair, AnAllocationStillInUseStaysMapped) {
  devA->heldExports = true;
  handshake();
  ASSERT_TRUE(B->reserve({}, {}).isOk());
  DeviceBuffer s(*devA, kLarge), r(*devB, kLarge);
  const int mapped = devB->liveMappings.load();
  s.fill(82);
  auto sent = A->postSend(s.data(), kLarge, Tag{2, 1});
  auto got = B->postRecv(r.data(), kLarge, Tag{2, 1});
  drive({sent, got});
  synchronize();
  EXPECT_TRUE(r.holds(82));
  driveFor(20);
  ASSERT_TRUE(B->reserve({}, {}).isOk());
  EXPECT_EQ(devB->liveMappings.load(), mapped + 1);
}

TEST_F(DirectPair, AReceiveOfAnotherSizeFailsAndTheSendStillEnds) {
  DeviceBuffer s(*devA, kLarge), r(*devB, kLarge);
  s.fill(1);
  auto sent = A->postSend(s.data(), kLarge, Tag{9, 1});
  auto got = B->postRecv(r.data(), kLarge - 4, Tag{9, 1});
  drive({sent, got});
  EXPECT_EQ(got->state(), State::kFailed);
  EXPECT_EQ(got->failure(), Request::Failure::kDifferentCall);
  EXPECT_EQ(sent->state(), State::kDone);
  // The connection goes on.
  auto again = A->postSend(s.data(), kLarge, Tag{10, 1});
  auto gotAgain = B->postRecv(r.data(), kLarge, Tag{10, 1});
  drive({again, gotAgain});
  ASSERT_EQ(gotAgain->state(), State::kDone);
  synchronize();
  EXPECT_TRUE(r.holds(1));
}

TEST_F(DirectPair, ARecordPastThePeersAllocationFailsTheConnectionAndReadsNothing) {
  DeviceBuffer s(*devA, kLarge), r(*devB, kLarge);
  s.fill(6);
  devA->exportOffsetSkew = 4096;  // the message would run 4096 bytes past its allocation
  auto sent = A->postSend(s.data(), kLarge, Tag{5, 1});
  auto got = B->postRecv(r.data(), kLarge, Tag{5, 1});
  drive({sent, got});
  ASSERT_EQ(got->state(), State::kFailed);
  EXPECT_NE(got->error().message().find("of an allocation of"), std::string::npos)
      << got->error().message();
  EXPECT_EQ(sent->state(), State::kFailed);
  EXPECT_TRUE(devB->synchronize().isOk()) << devB->synchronize().message();  // no stray read
}

TEST_F(DirectPair, ASendToAPeerThatLeavesFailsRatherThanHangs) {
  DeviceBuffer s(*devA, kLarge);
  s.fill(2);
  auto sent = A->postSend(s.data(), kLarge, Tag{7, 1});
  driveFor(30);
  ASSERT_EQ(sent->state(), State::kPending);
  B.reset();
  drive({sent});
  EXPECT_EQ(sent->state(), State::kFailed);
}

}  // namespace
}  // namespace braid::transport::cuda_ipc
