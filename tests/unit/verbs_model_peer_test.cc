// The software model of the verbs: failed peers, RNR retries, queues, status names, threads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "verbs_model_fixtures.h"

namespace braid::ib {
namespace {

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
