// A stream's collective calls past the wrap of their 32-bit call number
// (src/call_tags.h): the call after number 2^32 - 1 is later than it, on
// the tags themselves and on the connections that match them by tag, the
// socket stream's and CUDA-IPC's. Without it, a job making small calls for
// hours failed its calls after the wrap as a mismatch.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "cuda_ipc_pair.h"
#include "src/call_tags.h"
#include "transports/channel_order.h"
#include "transports/stream_connection.h"
#include "transports/tcp/socket_stream.h"

namespace braid {
namespace {

using transport::Request;
using transport::StreamConnection;
using transport::Tag;
using State = Request::State;

constexpr uint32_t kLastNumber = 0xffffffff;  // the call before the wrap
constexpr uint64_t kCheck = 0x77;
constexpr int kStream = 3;

uint64_t lastCallTag() {
  return collectiveTagBase(kStream, kLastNumber);
}
uint64_t wrappedCallTag() {
  return collectiveTagBase(kStream, 0);
}
uint8_t channel() {
  return transport::channelOf(lastCallTag());
}

TEST(CallTags, TheCallAfterTheWrapIsLaterThanTheLastOne) {
  for (int stream : {0, 1, 5, 63}) {
    const uint64_t lastBound = collectiveTagBound(stream, kLastNumber);
    const uint64_t firstBound = collectiveTagBound(stream, 0);
    // The last call's range ends inside its channel, and no bound is 0 (no call).
    EXPECT_EQ(transport::channelOf(lastBound), transport::channelOf(channelBits(stream, false)));
    EXPECT_NE(collectiveTagBase(stream, 0), 0u);
    EXPECT_TRUE(failedInLaterCall(firstBound, lastBound)) << "stream " << stream;
    EXPECT_FALSE(failedInLaterCall(lastBound, firstBound)) << "stream " << stream;
    EXPECT_TRUE(failedInLaterCall(collectiveTagBound(stream, 1), firstBound));
    EXPECT_TRUE(failedInLaterCall(lastBound, collectiveTagBound(stream, kLastNumber - 1)));
    EXPECT_FALSE(failedInLaterCall(lastBound, lastBound));
    EXPECT_FALSE(failedInLaterCall(0, lastBound));
    // The call's tags come before its bound, the next call's not.
    EXPECT_TRUE(transport::tagBefore(collectiveTagBase(stream, kLastNumber) + 5, lastBound));
    EXPECT_FALSE(transport::tagBefore(collectiveTagBase(stream, 0), lastBound));
  }
}

// The ranges rangesBefore gives hold exactly the tags of the channel that
// come before the tag, and stay inside the channel (channel 255 too).
TEST(ChannelOrder, TheTagsBeforeATagAreOneOrTwoRangesOfItsChannel) {
  constexpr uint64_t kHalf = transport::kChannelTagNumbers / 2;
  constexpr uint64_t kLastNumber56 = transport::kChannelTagNumbers - 1;
  for (uint64_t channel : {0u, 6u, 255u})
    for (uint64_t number : {uint64_t{0}, uint64_t{1}, uint64_t{5}, kHalf - 1, kHalf, kHalf + 1,
                            kLastNumber56 - 1, kLastNumber56}) {
      const uint64_t tag = channel << 56 | number;
      std::vector<std::pair<uint64_t, uint64_t>> ranges;
      transport::rangesBefore(
          tag, [&](uint64_t first, uint64_t last) { ranges.emplace_back(first, last); });
      ASSERT_FALSE(ranges.empty());
      for (auto [first, last] : ranges) {
        EXPECT_LE(first, last);
        EXPECT_EQ(transport::channelOf(first), channel);
        EXPECT_EQ(transport::channelOf(last), channel);
      }
      for (uint64_t offset :
           {uint64_t{0}, uint64_t{1}, uint64_t{2}, kHalf - 1, kHalf, kHalf + 1, kLastNumber56}) {
        for (uint64_t other :
             {(number + offset) & kLastNumber56, (number - offset) & kLastNumber56}) {
          const uint64_t value = channel << 56 | other;
          bool inRange = false;
          for (auto [first, last] : ranges) inRange = inRange || (value >= first && value <= last);
          EXPECT_EQ(inRange, transport::tagBefore(value, tag))
              << "channel " << channel << " number " << number << " other " << other;
        }
      }
    }
}

// A latest arrival left behind for most of the circle reads as ahead (a
// receive then fails as overtaken); forgotten in time, it does not.
TEST(ChannelOrder, ALatestArrivalFarBehindIsForgottenBeforeItReadsAsAhead) {
  const uint32_t threeQuarters = 3u << 30;
  transport::LatestArrivals latest;
  latest.arrived(collectiveTagBase(kStream, 5));
  const uint64_t farLater = collectiveTagBase(kStream, 5 + threeQuarters);
  EXPECT_TRUE(latest.after(farLater).has_value());
  latest.forgetBefore(collectiveTagBase(kStream, 5 + kForgetArrivalsEvery));
  EXPECT_FALSE(latest.after(farLater).has_value());
  // One that is not before the tag stays.
  latest.arrived(collectiveTagBase(kStream, 7));
  latest.forgetBefore(collectiveTagBase(kStream, 6));
  EXPECT_TRUE(latest.after(collectiveTagBase(kStream, 6)).has_value());
  EXPECT_TRUE(forgetsArrivalsAt(0) && forgetsArrivalsAt(kForgetArrivalsEvery));
  EXPECT_FALSE(forgetsArrivalsAt(kForgetArrivalsEvery - 1));
}

// The two ends of a socket-stream connection, driven by hand.
class StreamPair : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    sender_ = end(fds[0], 1);
    receiver_ = end(fds[1], 0);
  }
  static std::unique_ptr<StreamConnection> end(int fd, int peer) {
    return std::make_unique<StreamConnection>(
        std::make_unique<tcp::SocketStream>(tcp::Fd(fd), peer), peer);
  }
  void drive(std::initializer_list<transport::RequestPtr> requests) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      (void)sender_->progress();
      (void)receiver_->progress();
      bool pending = false;
      for (const auto& r : requests) pending = pending || r->state() == State::kPending;
      if (!pending) return;
    }
    ADD_FAILURE() << "requests still pending after 10 s";
  }
  transport::RequestPtr send(uint64_t tag, uint8_t value) {
    sent_.push_back(std::vector<uint8_t>(100, value));
    return sender_->postSend(sent_.back().data(), 100, Tag{tag, kCheck});
  }

  std::unique_ptr<StreamConnection> sender_, receiver_;
  std::vector<std::vector<uint8_t>> sent_;
  std::vector<uint8_t> last_ = std::vector<uint8_t>(100), wrapped_ = std::vector<uint8_t>(100);
};

TEST_F(StreamPair, ReceivesPostedForTheCallsBeforeAndAfterTheWrapBothMatch) {
  auto gotLast = receiver_->postRecv(last_.data(), 100, Tag{lastCallTag(), kCheck});
  auto gotWrapped = receiver_->postRecv(wrapped_.data(), 100, Tag{wrappedCallTag(), kCheck});
  auto s1 = send(lastCallTag(), 1);
  auto s2 = send(wrappedCallTag(), 2);
  drive({gotLast, gotWrapped, s1, s2});
  ASSERT_EQ(gotLast->state(), State::kDone) << gotLast->error().message();
  ASSERT_EQ(gotWrapped->state(), State::kDone) << gotWrapped->error().message();
  EXPECT_EQ(last_, std::vector<uint8_t>(100, 1));
  EXPECT_EQ(wrapped_, std::vector<uint8_t>(100, 2));
}

TEST_F(StreamPair, AReceiveAfterTheWrapIsNotTakenAsOvertakenByTheLastCall) {
  auto gotLast = receiver_->postRecv(last_.data(), 100, Tag{lastCallTag(), kCheck});
  auto s1 = send(lastCallTag(), 1);
  drive({gotLast, s1});
  ASSERT_EQ(gotLast->state(), State::kDone);
  auto gotWrapped = receiver_->postRecv(wrapped_.data(), 100, Tag{wrappedCallTag(), kCheck});
  EXPECT_EQ(gotWrapped->state(), State::kPending);
  auto s2 = send(wrappedCallTag(), 2);
  drive({gotWrapped, s2});
  ASSERT_EQ(gotWrapped->state(), State::kDone) << gotWrapped->error().message();
  EXPECT_EQ(wrapped_, std::vector<uint8_t>(100, 2));
  // The order still tells a mismatch: a receive for the last call, now
  // that the call after the wrap has arrived, is overtaken.
  auto stale = receiver_->postRecv(last_.data(), 100, Tag{lastCallTag() + 1, kCheck});
  EXPECT_EQ(stale->state(), State::kFailed);
  EXPECT_EQ(stale->failure(), Request::Failure::kOvertaken);
}

TEST_F(StreamPair, TheNextCallsMessageAfterTheWrapIsNoStrayOfTheLastCall) {
  auto gotLast = receiver_->postRecv(last_.data(), 100, Tag{lastCallTag(), kCheck});
  auto s1 = send(lastCallTag(), 1);
  auto s2 = send(wrappedCallTag(), 2);  // a peer already in the next call
  drive({gotLast, s1, s2});
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!receiver_->unclaimed(channel(), collectiveTagBound(kStream, 0)) &&
         std::chrono::steady_clock::now() < until)
    (void)receiver_->progress();
  // It is unclaimed before the end of its own call, not before the last one's.
  ASSERT_TRUE(receiver_->unclaimed(channel(), collectiveTagBound(kStream, 0)).has_value());
  EXPECT_FALSE(receiver_->unclaimed(channel(), collectiveTagBound(kStream, kLastNumber)));
}

TEST_F(StreamPair, AChannelIdleForMostOfTheCircleReceivesOnceItsArrivalsAreForgotten) {
  const uint64_t early = collectiveTagBase(kStream, 10);
  const uint64_t late = collectiveTagBase(kStream, 10 + (3u << 30));
  auto gotEarly = receiver_->postRecv(last_.data(), 100, Tag{early, kCheck});
  auto s1 = send(early, 1);
  drive({gotEarly, s1});
  ASSERT_EQ(gotEarly->state(), State::kDone);
  receiver_->forgetArrivalsBefore(collectiveTagBase(kStream, 10 + kForgetArrivalsEvery));
  auto gotLate = receiver_->postRecv(wrapped_.data(), 100, Tag{late, kCheck});
  EXPECT_EQ(gotLate->state(), State::kPending);
  auto s2 = send(late, 2);
  drive({gotLate, s2});
  ASSERT_EQ(gotLate->state(), State::kDone) << gotLate->error().message();
  EXPECT_EQ(wrapped_, std::vector<uint8_t>(100, 2));
}

}  // namespace

namespace transport::cuda_ipc {
namespace {

TEST_F(CudaIpcPair, ReceivesPostedForTheCallsBeforeAndAfterTheWrapBothMatch) {
  DeviceBuffer s1(*devA, 64), s2(*devA, 64), r1(*devB, 64), r2(*devB, 64);
  s1.fill(1);
  s2.fill(2);
  auto gotLast = B->postRecv(r1.data(), 64, Tag{lastCallTag(), kCheck});
  auto gotWrapped = B->postRecv(r2.data(), 64, Tag{wrappedCallTag(), kCheck});
  auto sent1 = A->postSend(s1.data(), 64, Tag{lastCallTag(), kCheck});
  auto sent2 = A->postSend(s2.data(), 64, Tag{wrappedCallTag(), kCheck});
  drive({gotLast, gotWrapped, sent1, sent2});
  ASSERT_EQ(gotLast->state(), State::kDone) << gotLast->error().message();
  ASSERT_EQ(gotWrapped->state(), State::kDone) << gotWrapped->error().message();
  synchronize();
  EXPECT_TRUE(r1.holds(1));
  EXPECT_TRUE(r2.holds(2));
}

TEST_F(CudaIpcPair, AReceiveAfterTheWrapIsNotTakenAsOvertakenByTheLastCall) {
  DeviceBuffer s1(*devA, 64), s2(*devA, 64), r1(*devB, 64), r2(*devB, 64);
  s2.fill(2);
  auto gotLast = B->postRecv(r1.data(), 64, Tag{lastCallTag(), kCheck});
  auto sent1 = A->postSend(s1.data(), 64, Tag{lastCallTag(), kCheck});
  drive({gotLast, sent1});
  ASSERT_EQ(gotLast->state(), State::kDone);
  auto gotWrapped = B->postRecv(r2.data(), 64, Tag{wrappedCallTag(), kCheck});
  EXPECT_EQ(gotWrapped->state(), State::kPending);
  auto sent2 = A->postSend(s2.data(), 64, Tag{wrappedCallTag(), kCheck});
  drive({gotWrapped, sent2});
  ASSERT_EQ(gotWrapped->state(), State::kDone) << gotWrapped->error().message();
  synchronize();
  EXPECT_TRUE(r2.holds(2));
}

TEST_F(CudaIpcPair, AChannelIdleForMostOfTheCircleReceivesOnceItsArrivalsAreForgotten) {
  DeviceBuffer s1(*devA, 64), s2(*devA, 64), r1(*devB, 64), r2(*devB, 64);
  s2.fill(2);
  const uint64_t early = collectiveTagBase(kStream, 10);
  const uint64_t late = collectiveTagBase(kStream, 10 + (3u << 30));
  auto gotEarly = B->postRecv(r1.data(), 64, Tag{early, kCheck});
  auto sent1 = A->postSend(s1.data(), 64, Tag{early, kCheck});
  drive({gotEarly, sent1});
  ASSERT_EQ(gotEarly->state(), State::kDone);
  B->forgetArrivalsBefore(collectiveTagBase(kStream, 10 + kForgetArrivalsEvery));
  auto gotLate = B->postRecv(r2.data(), 64, Tag{late, kCheck});
  EXPECT_EQ(gotLate->state(), State::kPending);
  auto sent2 = A->postSend(s2.data(), 64, Tag{late, kCheck});
  drive({gotLate, sent2});
  ASSERT_EQ(gotLate->state(), State::kDone) << gotLate->error().message();
  synchronize();
  EXPECT_TRUE(r2.holds(2));
}

TEST_F(CudaIpcPair, TheNextCallsMessageAfterTheWrapIsNoStrayOfTheLastCall) {
  DeviceBuffer s1(*devA, 64), s2(*devA, 64), r1(*devB, 64);
  auto gotLast = B->postRecv(r1.data(), 64, Tag{lastCallTag(), kCheck});
  auto sent1 = A->postSend(s1.data(), 64, Tag{lastCallTag(), kCheck});
  auto sent2 = A->postSend(s2.data(), 64, Tag{wrappedCallTag(), kCheck});
  drive({gotLast, sent1, sent2});
  ASSERT_TRUE(B->unclaimed(channel(), collectiveTagBound(kStream, 0)).has_value());
  EXPECT_FALSE(B->unclaimed(channel(), collectiveTagBound(kStream, kLastNumber)));
  synchronize();
}

}  // namespace
}  // namespace transport::cuda_ipc
}  // namespace braid
