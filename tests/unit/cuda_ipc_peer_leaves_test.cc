// The CUDA-IPC transport when the peer leaves: records written or read
// with the goodbye still count, and what the peer said before it went is
// delivered, in the handshake and after it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda_ipc_pair.h"
#include "fake_ipc_device.h"
#include "transports/cuda_ipc/cuda_ipc_connection.h"

namespace braid::transport::cuda_ipc {
namespace {

// A host connection that, once told endAfter(n), reports the peer gone from
// its n-th call of progress() on, after doing that call's work: what a
// socket does when the peer read the last record and closed while this end
// was writing it.
class ControlThatEnds final : public Connection {
 public:
  explicit ControlThatEnds(std::unique_ptr<Connection> inner) : inner_(std::move(inner)) {}
  RequestPtr postSend(const void* data, size_t bytes, Tag tag) override {
    return inner_->postSend(data, bytes, tag);
  }
  RequestPtr postRecv(void* data, size_t bytes, Tag tag) override {
    return inner_->postRecv(data, bytes, tag);
  }
  RequestPtr postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                            const Combiner& combiner) override {
    return inner_->postRecvReduce(dst, local, bytes, tag, combiner);
  }
  Result<bool> progress() override {
    if (lateReads_ > 0) {
      --lateReads_;
      return true;
    }
    auto moved = inner_->progress();
    if (callsLeft_ > 0 && --callsLeft_ == 0) ended_ = true;
    if (ended_) return remoteError("test: the peer left");
    return moved;
  }
  int pollFd() const override { return inner_->pollFd(); }
  bool wantsWrite() const override { return inner_->wantsWrite(); }
  void abort(const Status& reason) override { inner_->abort(reason); }
  Status peerFailure() const override { return inner_->peerFailure(); }
  bool ended() const override { return inner_->ended(); }
  std::optional<Tag> unclaimed(uint8_t channel, uint64_t below) override {
    return inner_->unclaimed(channel, below);
  }
  int peer() const override { return inner_->peer(); }
  void endAfter(int calls) { callsLeft_ = calls; }
  // The next `calls` calls of progress() read nothing but say something
  // moved: what arrived then is read by a later call.
  void readLate(int calls) { lateReads_ = calls; }

 private:
  std::unique_ptr<Connection> inner_;
  int callsLeft_ = 0;
  int lateReads_ = 0;
  bool ended_ = false;
};

// Two ends over a socket pair, the host connection of one of them wrapped
// in ControlThatEnds, with the handshake done (an empty message each way
// of A to B), so that the next progress() of either end does only the
// test's work.
struct ScriptedPair {
  std::shared_ptr<FakeIpcDevice> devA = std::make_shared<FakeIpcDevice>();
  std::shared_ptr<FakeIpcDevice> devB = std::make_shared<FakeIpcDevice>();
  std::unique_ptr<CudaIpcConnection> a, b;
  ControlThatEnds* scripted = nullptr;
};

void openScripted(bool scriptA, ScriptedPair& pair) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  std::unique_ptr<Connection> controlA = controlEnd(fds[0], 1), controlB = controlEnd(fds[1], 0);
  auto wrapped = std::make_unique<ControlThatEnds>(std::move(scriptA ? controlA : controlB));
  pair.scripted = wrapped.get();
  (scriptA ? controlA : controlB) = std::move(wrapped);
  auto a = CudaIpcConnection::create(std::move(controlA), pair.devA, smallSlots());
  auto b = CudaIpcConnection::create(std::move(controlB), pair.devB, smallSlots());
  ASSERT_TRUE(a.isOk() && b.isOk());
  pair.a = std::move(*a);
  pair.b = std::move(*b);
  uint8_t nothing = 0;
  auto warmS = pair.a->postSend(&nothing, 0, Tag{1, 1});
  auto warmR = pair.b->postRecv(&nothing, 0, Tag{1, 1});
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((warmS->state() == State::kPending || warmR->state() == State::kPending) &&
         std::chrono::steady_clock::now() < until) {
    (void)pair.a->progress();
    (void)pair.b->progress();
  }
  ASSERT_EQ(warmS->state(), State::kDone);
  ASSERT_EQ(warmR->state(), State::kDone);
}

// A send whose last record was written is done even if the host connection
// fails in the same progress() call: the peer has everything it needs (a
// rank may destroy its communicator right after its last receive).
TEST(CudaIpcPeerLeaves, ASendWhoseLastRecordWasWrittenIsDoneNotFailed) {
  ScriptedPair pair;
  ASSERT_NO_FATAL_FAILURE(openScripted(true, pair));
  auto &a = pair.a, &b = pair.b;
  auto &devA = pair.devA, &devB = pair.devB;
  ControlThatEnds& endsA = *pair.scripted;
  DeviceBuffer s(*devA, 100), r(*devB, 100);
  s.fill(3);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto sent = a->postSend(s.data(), 100, Tag{2, 1});
  auto got = b->postRecv(r.data(), 100, Tag{2, 1});
  // A's next progress(): the first call of its host connection reads, the
  // send is queued and its record posted, the second call writes the record
  // and then reports the peer gone.
  endsA.endAfter(2);
  (void)a->progress();
  EXPECT_EQ(sent->state(), State::kDone) << sent->error().message();
  while (got->state() == State::kPending && std::chrono::steady_clock::now() < until)
    (void)b->progress();
  ASSERT_EQ(got->state(), State::kDone) << got->error().message();
  EXPECT_TRUE(devA->synchronize().isOk());
  EXPECT_TRUE(devB->synchronize().isOk());
  EXPECT_TRUE(r.holds(3));
  // Later work on A fails: the connection ended (the next progress() says so).
  auto later = a->postSend(s.data(), 100, Tag{3, 1});
  EXPECT_FALSE(a->progress().isOk());
  EXPECT_EQ(later->state(), State::kFailed);
}

// The peer's last record and its goodbye (it destroyed its communicator
// right after its send) may both be read by the host connection's second
// call in one progress() (the one that sends what that call queued): the
// record is still handled, and the receive it completes is done, not failed
// with the goodbye. Found as a rare failure of the GPU job tests' receives.
TEST(CudaIpcPeerLeaves, ARecordReadWithTheGoodbyeIsStillHandled) {
  ScriptedPair pair;
  ASSERT_NO_FATAL_FAILURE(openScripted(false, pair));
  auto &a = pair.a, &b = pair.b;
  auto &devA = pair.devA, &devB = pair.devB;
  ControlThatEnds& lateB = *pair.scripted;
  DeviceBuffer s(*devA, 100), r(*devB, 100);
  s.fill(5);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto got = b->postRecv(r.data(), 100, Tag{2, 1});
  auto sent = a->postSend(s.data(), 100, Tag{2, 1});
  while (sent->state() == State::kPending && std::chrono::steady_clock::now() < until)
    (void)a->progress();
  ASSERT_EQ(sent->state(), State::kDone) << sent->error().message();
  EXPECT_TRUE(devA->synchronize().isOk());
  a->abort(Status(ErrorCode::kOk, "rank 0 destroyed the communicator"));
  a.reset();
  // B's first host call reads nothing; its second reads the record and the
  // goodbye behind it.
  lateB.readLate(1);
  (void)b->progress();
  while (got->state() == State::kPending && std::chrono::steady_clock::now() < until)
    (void)b->progress();
  ASSERT_EQ(got->state(), State::kDone) << got->error().message();
  EXPECT_TRUE(devB->synchronize().isOk());
  EXPECT_TRUE(r.holds(5));
}

// A peer that fails and leaves during the handshake takes with it what
// this end opens (a cuMem descriptor is fetched from its process): this end
// reports the reason the peer gave, not its own failed open.
TEST_F(CudaIpcPair, APeerThatLeavesDuringTheHandshakeIsReportedWithItsReason) {
  devA->beforeOpen = [this] {
    B->abort(Status(ErrorCode::kUnhandledCudaError, "the peer's own reason"));
    return remoteError("the exporter is gone");
  };
  DeviceBuffer r(*devA, 64);
  auto got = A->postRecv(r.data(), 64, Tag{1, 1});
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (got->state() == State::kPending && std::chrono::steady_clock::now() < until) {
    (void)B->progress();
    (void)A->progress();
  }
  ASSERT_EQ(got->state(), State::kFailed);
  EXPECT_NE(got->error().message().find("the peer's own reason"), std::string::npos)
      << got->error().message();
}

// A message that arrived whole before its sender left (a rank destroys its
// communicator right after its last send) is still delivered to a receive
// posted after the goodbye, as the host connections deliver theirs; one
// that never came fails with the goodbye.
TEST_F(CudaIpcPair, AMessageThatArrivedBeforeThePeerLeftIsDeliveredAfter) {
  const size_t bytes = 4096 * 9 + 5;  // more than B's 4 slots: B copies them out to free them
  DeviceBuffer s(*devA, bytes), r(*devB, bytes), never(*devB, 64);
  s.fill(8);
  auto warmS = A->postSend(s.data(), 0, Tag{1, 1});
  auto warmR = B->postRecv(r.data(), 0, Tag{1, 1});
  drive({warmS, warmR});
  auto sent = A->postSend(s.data(), bytes, Tag{2, 1});
  drive({sent});
  ASSERT_EQ(sent->state(), State::kDone) << sent->error().message();
  EXPECT_TRUE(devA->synchronize().isOk());
  A->abort(Status(ErrorCode::kOk, "rank 0 destroyed the communicator"));
  A.reset();
  for (int i = 0; i < 8; ++i) (void)B->progress();  // B reads the goodbye
  auto got = B->postRecv(r.data(), bytes, Tag{2, 1});
  auto lost = B->postRecv(never.data(), 64, Tag{3, 1});
  drive({got, lost});
  ASSERT_EQ(got->state(), State::kDone) << got->error().message();
  EXPECT_TRUE(devB->synchronize().isOk());
  EXPECT_TRUE(r.holds(8));
  ASSERT_EQ(lost->state(), State::kFailed);
  EXPECT_NE(lost->error().message().find("destroyed the communicator"), std::string::npos)
      << lost->error().message();
}

}  // namespace
}  // namespace braid::transport::cuda_ipc
