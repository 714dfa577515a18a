// GPU memory over a host connection (transports/gpu_staged): two ends in
// this process over a socket pair, each with a stand-in device of its own
// (fake_ipc_device.h), whose stream is slowed where a missing wait would
// show up as wrong bytes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <initializer_list>
#include <tuple>
#include <vector>

#include "fake_ipc_device.h"
#include "host_pair.h"
#include "transports/gpu_staged/staged_connection.h"

namespace braid::transport::gpu_staged {
namespace {

using cuda_ipc::DeviceBuffer;
using cuda_ipc::FakeIpcDevice;
using State = Request::State;

class StagedPair : public ::testing::Test {
 protected:
  void SetUp() override {
    std::tie(hostA, hostB) = transport::testing::hostPair();
    ASSERT_TRUE(hostA && hostB);
    devA = std::make_shared<FakeIpcDevice>();
    devB = std::make_shared<FakeIpcDevice>();
    remake(StagedConnection::Options{}.bouncesPerDirection);
  }

  // Both ends anew, each holding at most `bounces` buffers each way.
  void remake(int bounces) {
    StagedConnection::Options options;
    options.minBounceBytes = 4096;
    options.bouncesPerDirection = bounces;
    A = std::make_unique<StagedConnection>(*hostA, devA, options);
    B = std::make_unique<StagedConnection>(*hostB, devB, options);
  }

  // Drives both ends until no request is pending (or 10 s).
  void drive(std::initializer_list<RequestPtr> requests) {
    drive(std::vector<RequestPtr>(requests));
  }
  void drive(const std::vector<RequestPtr>& requests) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      (void)A->progress();
      (void)B->progress();
      bool pending = false;
      for (const auto& r : requests) pending = pending || r->state() == State::kPending;
      if (!pending) return;
    }
    ADD_FAILURE() << "requests still pending after 10 s";
  }
  void synchronize() {
    EXPECT_TRUE(devA->synchronize().isOk()) << devA->synchronize().message();
    EXPECT_TRUE(devB->synchronize().isOk()) << devB->synchronize().message();
  }

  std::unique_ptr<Connection> hostA, hostB;
  std::shared_ptr<FakeIpcDevice> devA, devB;
  std::unique_ptr<StagedConnection> A, B;
};

TEST_F(StagedPair, MessagesOfEverySizeArriveBothWays) {
  devA->workDelay = devB->workDelay = std::chrono::microseconds(200);
  uint64_t tag = 10;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{100}, size_t{4096}, size_t{3 << 20}}) {
    SCOPED_TRACE(bytes);
    DeviceBuffer sa(*devA, bytes + 1), ra(*devA, bytes + 1), sb(*devB, bytes + 1),
        rb(*devB, bytes + 1);
    sa.fill(1);
    sb.fill(2);
    ++tag;
    auto s1 = A->postSend(sa.data(), bytes, Tag{tag, 5});
    auto s2 = B->postSend(sb.data(), bytes, Tag{tag, 6});
    auto r1 = B->postRecv(rb.data(), bytes, Tag{tag, 5});
    auto r2 = A->postRecv(ra.data(), bytes, Tag{tag, 6});
    drive({s1, s2, r1, r2});
    for (const auto& r : {s1, s2, r1, r2})
      ASSERT_EQ(r->state(), State::kDone) << r->error().message();
    synchronize();
    EXPECT_EQ(std::memcmp(rb.data(), sa.data(), bytes), 0);
    EXPECT_EQ(std::memcmp(ra.data(), sb.data(), bytes), 0);
  }
  // Every payload byte crossed through the devices' copies.
  EXPECT_GT(devA->copies.load(), 0u);
  EXPECT_GT(devB->copies.load(), 0u);
  // Whose events no peer opens: none exported.
  EXPECT_GT(devA->unsharedEvents.load(), 0u);
  EXPECT_EQ(devA->events.load(), 0u);
  EXPECT_EQ(devB->events.load(), 0u);
}

// A send leaves only once its copy out of the GPU has run: on a slow stream
// the bytes sent are still the ones the GPU held when the send was posted
// after work that wrote them.
TEST_F(StagedPair, ASendCarriesWhatTheStreamWroteBeforeIt) {
  devA->workDelay = std::chrono::milliseconds(5);
  DeviceBuffer source(*devA, 64 * 1024), staging(*devA, 64 * 1024), dst(*devB, 64 * 1024);
  staging.fill(7);
  std::memset(source.data(), 0, source.bytes);
  // Queued before the send: the send must carry these bytes, not zeros.
  ASSERT_TRUE(devA->enqueueCopy(source.data(), staging.data(), source.bytes).isOk());
  auto s = A->postSend(source.data(), source.bytes, Tag{1, 1});
  auto r = B->postRecv(dst.data(), dst.bytes, Tag{1, 1});
  drive({s, r});
  ASSERT_EQ(r->state(), State::kDone) << r->error().message();
  synchronize();
  EXPECT_TRUE(dst.holds(7));
}

// A receive is done once its copy into the GPU is queued; its bounce buffer
// is reused only after that copy ran, or the next message would overwrite
// the bytes the copy has yet to read.
TEST_F(StagedPair, ABounceBufferIsReusedOnlyAfterItsCopyRan) {
  devB->workDelay = std::chrono::milliseconds(20);
  constexpr size_t kBytes = 4096;
  DeviceBuffer s1(*devA, kBytes), s2(*devA, kBytes), d1(*devB, kBytes), d2(*devB, kBytes);
  s1.fill(1);
  s2.fill(2);
  auto send1 = A->postSend(s1.data(), kBytes, Tag{1, 0});
  auto recv1 = B->postRecv(d1.data(), kBytes, Tag{1, 0});
  drive({send1, recv1});
  ASSERT_EQ(recv1->state(), State::kDone);
  (void)B->progress();
  auto send2 = A->postSend(s2.data(), kBytes, Tag{2, 0});
  auto recv2 = B->postRecv(d2.data(), kBytes, Tag{2, 0});
  drive({send2, recv2});
  ASSERT_EQ(recv2->state(), State::kDone);
  synchronize();
  EXPECT_TRUE(d1.holds(1));
  EXPECT_TRUE(d2.holds(2));
  // Two bounce buffers: the second receive did not wait for the first's.
  EXPECT_EQ(B->bounceBuffers(), 2u);
  // Later messages reuse them, once progress saw their copies done.
  (void)B->progress();
  auto send3 = A->postSend(s1.data(), kBytes, Tag{3, 0});
  auto recv3 = B->postRecv(d2.data(), kBytes, Tag{3, 0});
  drive({send3, recv3});
  synchronize();
  EXPECT_TRUE(d2.holds(1));
  EXPECT_EQ(B->bounceBuffers(), 2u);
}

// Pinned memory is bounded: messages posted while every bounce buffer of
// their direction is in use wait for one to come back, sends in their order,
// rather than each pinning one of its own.
TEST_F(StagedPair, ManyMessagesShareABoundedNumberOfBounceBuffers) {
  remake(2);
  devA->workDelay = devB->workDelay = std::chrono::microseconds(300);
  constexpr int kMessages = 12;
  constexpr size_t kBytes = 3000;
  std::vector<std::unique_ptr<DeviceBuffer>> sources, destinations;
  std::vector<RequestPtr> sends, recvs;
  for (int m = 0; m < kMessages; ++m) {
    sources.push_back(std::make_unique<DeviceBuffer>(*devA, kBytes));
    destinations.push_back(std::make_unique<DeviceBuffer>(*devB, kBytes));
    sources.back()->fill(static_cast<uint8_t>(m + 1));
    // Each message has its own size, so that one delivered into another's
    // receive shows.
    const size_t bytes = kBytes - static_cast<size_t>(m);
    recvs.push_back(B->postRecv(destinations.back()->data(), bytes, Tag{uint64_t(m + 1), 0}));
    sends.push_back(A->postSend(sources.back()->data(), bytes, Tag{uint64_t(m + 1), 0}));
  }
  EXPECT_EQ(A->bounceBuffers(), 2u);
  EXPECT_EQ(B->bounceBuffers(), 2u);
  std::vector<RequestPtr> all = sends;
  all.insert(all.end(), recvs.begin(), recvs.end());
  drive(all);
  for (int m = 0; m < kMessages; ++m) {
    ASSERT_EQ(sends[m]->state(), State::kDone) << m << ": " << sends[m]->error().message();
    ASSERT_EQ(recvs[m]->state(), State::kDone) << m << ": " << recvs[m]->error().message();
  }
  synchronize();
  for (int m = 0; m < kMessages; ++m) {
    const size_t bytes = kBytes - static_cast<size_t>(m);
    EXPECT_EQ(std::memcmp(destinations[m]->data(), sources[m]->data(), bytes), 0) << m;
  }
  EXPECT_EQ(A->bounceBuffers(), 2u);
  EXPECT_EQ(B->bounceBuffers(), 2u);
}

// reserve() pins every buffer ahead, each way, so that messages up to the
// sizes reserved pin nothing more, however many are posted at once.
TEST_F(StagedPair, AfterReserveMessagesThatFitPinNothing) {
  remake(4);
  // Ten messages each way, of two sizes: the four largest are reserved.
  std::vector<size_t> sizes;
  for (int m = 0; m < 10; ++m) sizes.push_back(m % 2 ? 20000 : 100);
  ASSERT_TRUE(A->reserve(sizes, {}).isOk());
  ASSERT_TRUE(B->reserve({}, sizes).isOk());
  EXPECT_EQ(A->bounceBuffers(), 4u);
  EXPECT_EQ(B->bounceBuffers(), 4u);
  ASSERT_TRUE(A->reserve(sizes, {}).isOk());  // made already
  EXPECT_EQ(A->bounceBuffers(), 4u);
  const size_t pinnedA = devA->hostAllocations.load(), pinnedB = devB->hostAllocations.load();
  DeviceBuffer source(*devA, 20000), destination(*devB, 20000 * 10);
  source.fill(9);
  std::vector<RequestPtr> requests;
  for (uint64_t m = 0; m < 10; ++m) {
    const size_t bytes = m % 2 ? 20000 : 100;
    requests.push_back(B->postRecv(destination.data() + m * 20000, bytes, Tag{m + 1, 0}));
    requests.push_back(A->postSend(source.data(), bytes, Tag{m + 1, 0}));
  }
  drive(requests);
  for (const auto& r : requests) ASSERT_EQ(r->state(), State::kDone) << r->error().message();
  synchronize();
  for (uint64_t m = 0; m < 10; ++m)
    EXPECT_EQ(std::memcmp(destination.data() + m * 20000, source.data(), m % 2 ? 20000 : 100), 0)
        << m;
  EXPECT_EQ(devA->hostAllocations.load(), pinnedA);
  EXPECT_EQ(devB->hostAllocations.load(), pinnedB);
}

// reserve() pins without the connection's lock: pinning may wait for the
// driver's memory lock, held by an application thread until a CUDA stream
// gets past the call that runs now, and that call must still progress
// this connection meanwhile.
TEST_F(StagedPair, ReservePinsWithoutHoldingTheConnection) {
  std::future<void> progressed;
  bool progressedWhilePinning = false;
  devA->beforeAllocateHost = [&] {
    if (progressed.valid()) return;
    progressed = std::async(std::launch::async, [&] { (void)A->progress(); });
    progressedWhilePinning =
        progressed.wait_for(std::chrono::seconds(2)) == std::future_status::ready;
  };
  const std::vector<size_t> sizes = {5000, 5000};
  ASSERT_TRUE(A->reserve(sizes, sizes).isOk());
  ASSERT_TRUE(progressed.valid());
  progressed.wait();
  EXPECT_TRUE(progressedWhilePinning);
  EXPECT_EQ(A->bounceBuffers(), 4u);
}

// Where buffers were reserved, a receive that finds none free waits for
// one on its way back (its bytes being copied into the GPU, maybe by an
// earlier call) rather than pin one more while a CUDA stream may wait.
TEST_F(StagedPair, AReservedReceiveWaitsForABufferOnItsWayBack) {
  devB->workDelay = std::chrono::milliseconds(20);
  const std::vector<size_t> one = {4096};
  ASSERT_TRUE(B->reserve({}, one).isOk());
  EXPECT_EQ(B->bounceBuffers(), 1u);
  DeviceBuffer s1(*devA, 4096), s2(*devA, 4096), d1(*devB, 4096), d2(*devB, 4096);
  s1.fill(1);
  s2.fill(2);
  auto send1 = A->postSend(s1.data(), 4096, Tag{1, 0});
  auto recv1 = B->postRecv(d1.data(), 4096, Tag{1, 0});
  drive({send1, recv1});
  ASSERT_EQ(recv1->state(), State::kDone);
  auto send2 = A->postSend(s2.data(), 4096, Tag{2, 0});
  auto recv2 = B->postRecv(d2.data(), 4096, Tag{2, 0});
  drive({send2, recv2});
  ASSERT_EQ(recv2->state(), State::kDone) << recv2->error().message();
  synchronize();
  EXPECT_TRUE(d1.holds(1));
  EXPECT_TRUE(d2.holds(2));
  EXPECT_EQ(B->bounceBuffers(), 1u);
}

// A receive may wait for a buffer only where one surely comes back: here
// the only buffer is held by the receive of message 2, which the peer sends
// only after this rank answered message 1. The receive of message 1,
// posted second, must not wait behind it: it pins a buffer of its own.
TEST_F(StagedPair, AReceivePostedAfterThatOfALaterMessageDoesNotWaitForIt) {
  remake(1);
  DeviceBuffer first(*devA, 1000), second(*devA, 1000), answer(*devB, 1000), got1(*devB, 1000),
      got2(*devB, 1000), gotAnswer(*devA, 1000);
  first.fill(1);
  second.fill(2);
  answer.fill(3);
  auto recv2 = B->postRecv(got2.data(), 1000, Tag{2, 0});
  auto recv1 = B->postRecv(got1.data(), 1000, Tag{1, 0});
  auto send1 = A->postSend(first.data(), 1000, Tag{1, 0});
  drive({send1, recv1});
  ASSERT_EQ(recv1->state(), State::kDone) << recv1->error().message();
  auto reply = B->postSend(answer.data(), 1000, Tag{1, 1});
  auto replyRecv = A->postRecv(gotAnswer.data(), 1000, Tag{1, 1});
  drive({reply, replyRecv});
  ASSERT_EQ(replyRecv->state(), State::kDone) << replyRecv->error().message();
  auto send2 = A->postSend(second.data(), 1000, Tag{2, 0});
  drive({send2, recv2});
  ASSERT_EQ(recv2->state(), State::kDone) << recv2->error().message();
  synchronize();
  EXPECT_TRUE(got1.holds(1));
  EXPECT_TRUE(got2.holds(2));
  EXPECT_TRUE(gotAnswer.holds(3));
  EXPECT_EQ(B->bounceBuffers(), 3u);  // two receives, one send

  // In the order the peer sends, a later receive waits for the earlier's
  // buffer instead: no more is pinned.
  auto recv4 = B->postRecv(got2.data(), 1000, Tag{4, 0});
  auto recv3 = B->postRecv(got1.data(), 1000, Tag{3, 0});
  auto recv5 = B->postRecv(got1.data(), 1000, Tag{5, 0});
  auto send3 = A->postSend(first.data(), 1000, Tag{3, 0});
  auto send4 = A->postSend(second.data(), 1000, Tag{4, 0});
  auto send5 = A->postSend(first.data(), 1000, Tag{5, 0});
  drive({recv3, recv4, recv5, send3, send4, send5});
  for (const auto& r : {recv3, recv4, recv5}) ASSERT_EQ(r->state(), State::kDone);
  EXPECT_EQ(B->bounceBuffers(), 3u);
}

// A reduction reads the incoming bytes straight from the bounce buffer.
TEST_F(StagedPair, AReceiveWithReductionCombinesOnTheDevice) {
  constexpr size_t kCount = 5000;
  DeviceBuffer send(*devA, kCount * 4), local(*devB, kCount * 4), dst(*devB, kCount * 4);
  for (size_t i = 0; i < kCount; ++i) {
    const int32_t a = static_cast<int32_t>(i), b = static_cast<int32_t>(3 * i + 1);
    std::memcpy(send.data() + 4 * i, &a, 4);
    std::memcpy(local.data() + 4 * i, &b, 4);
  }
  Combiner sum;
  sum.unit = 4;
  sum.apply = [](void* d, const void* l, const void* in, size_t n, const void*) {
    for (size_t i = 0; i < n; ++i) {
      int32_t x, y;
      std::memcpy(&x, static_cast<const uint8_t*>(l) + 4 * i, 4);
      std::memcpy(&y, static_cast<const uint8_t*>(in) + 4 * i, 4);
      const int32_t z = x + y;
      std::memcpy(static_cast<uint8_t*>(d) + 4 * i, &z, 4);
    }
  };
  auto s = A->postSend(send.data(), send.bytes, Tag{1, 0});
  auto r = B->postRecvReduce(dst.data(), local.data(), dst.bytes, Tag{1, 0}, sum);
  drive({s, r});
  ASSERT_EQ(r->state(), State::kDone) << r->error().message();
  synchronize();
  for (size_t i = 0; i < kCount; ++i) {
    int32_t z;
    std::memcpy(&z, dst.data() + 4 * i, 4);
    ASSERT_EQ(z, static_cast<int32_t>(4 * i + 1)) << i;
  }
  EXPECT_EQ(devB->combines.load(), 1u);
}

// A message of another size than the receive fails it as misuse, with the
// host connection's message; the sender's side is unharmed.
TEST_F(StagedPair, AMessageOfAnotherSizeFailsTheReceive) {
  DeviceBuffer send(*devA, 100), dst(*devB, 200);
  auto s = A->postSend(send.data(), 100, Tag{1, 0});
  auto r = B->postRecv(dst.data(), 200, Tag{1, 0});
  drive({s, r});
  ASSERT_EQ(r->state(), State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kInvalidUsage) << r->error().message();
}

// A device that refuses work fails the send that needed it, cleanly.
TEST_F(StagedPair, ADeviceThatRefusesWorkFailsTheSend) {
  DeviceBuffer send(*devA, 100);
  devA->failEnqueues = true;
  auto s = A->postSend(send.data(), 100, Tag{1, 0});
  ASSERT_EQ(s->state(), State::kFailed);
  EXPECT_EQ(s->error().code(), ErrorCode::kUnhandledCudaError) << s->error().message();
}

// Abort fails what is pending here, and closes the host connection, so the
// peer's requests fail too rather than wait.
TEST_F(StagedPair, AbortFailsPendingRequestsOnBothEnds) {
  DeviceBuffer a(*devA, 100), b(*devB, 100);
  auto ra = A->postRecv(a.data(), 100, Tag{1, 0});
  auto rb = B->postRecv(b.data(), 100, Tag{2, 0});
  A->abort(Status(ErrorCode::kInternalError, "test abort"));
  EXPECT_EQ(ra->state(), State::kFailed);
  drive({rb});
  EXPECT_EQ(rb->state(), State::kFailed);
  auto late = A->postSend(a.data(), 100, Tag{3, 0});
  EXPECT_EQ(late->state(), State::kFailed);
}

// A peer that leaves right after its last send (an orderly close) must not
// take with it the messages that arrived before: a receive posted after
// this end saw the close still gets its bytes, copied into the GPU.
TEST_F(StagedPair, AMessageThatArrivedBeforeThePeerLeftIsStillReceived) {
  DeviceBuffer send(*devA, 5000), dst(*devB, 5000);
  send.fill(3);
  auto s = A->postSend(send.data(), 5000, Tag{1, 0});
  drive({s});
  ASSERT_EQ(s->state(), State::kDone);
  A->abort(Status::ok());
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (B->progress().isOk() && std::chrono::steady_clock::now() < until) {
  }
  ASSERT_FALSE(B->progress().isOk());  // B has seen the close
  auto r = B->postRecv(dst.data(), 5000, Tag{1, 0});
  (void)B->progress();
  ASSERT_EQ(r->state(), State::kDone) << r->error().message();
  synchronize();
  EXPECT_TRUE(dst.holds(3));
  // A receive of a message that never came fails, with the peer's leaving.
  auto never = B->postRecv(dst.data(), 5000, Tag{2, 0});
  (void)B->progress();
  EXPECT_EQ(never->state(), State::kFailed);
}

// A job that fails names its call to the peer (abortInCall), which then
// tells a failure of a later call than its own from one of the same call.
TEST_F(StagedPair, AnAbortInACallNamesTheCallToThePeer) {
  constexpr uint64_t kMark = (uint64_t{3} << 56) | 77;
  A->abortInCall(Status(ErrorCode::kInternalError, "test abort"), kMark);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (B->peerFailure().isOk() && std::chrono::steady_clock::now() < until) (void)B->progress();
  ASSERT_FALSE(B->peerFailure().isOk());
  EXPECT_EQ(B->peerFailedCall(), kMark);
}

}  // namespace
}  // namespace braid::transport::gpu_staged
