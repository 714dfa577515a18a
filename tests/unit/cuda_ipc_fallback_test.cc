// A pair whose ends cannot map each other's GPU memory: the cuda_ipc
// handshake declines on both ends alike (cuda_ipc_connection.h, "Mapping"),
// and IpcOrFallback (ipc_or_fallback.h) then carries the pair's messages
// over the fallback connection, those posted before the handshake decided
// too. Two ends in this process, each with a stand-in device of its own
// (fake_ipc_device.h), whose memory is host memory: so the host connection
// itself can stand in for the fallback, as gpu_staged shares it in braid.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

#include "fake_ipc_device.h"
#include "host_pair.h"
#include "transports/cuda_ipc/ipc_or_fallback.h"
#include "transports/gpu_staged/staged_connection.h"

namespace braid::transport::cuda_ipc {
namespace {

using State = Request::State;
using Mapping = CudaIpcConnection::Mapping;

constexpr uint8_t kChannel = 0xfd;
constexpr const char* kNoPeerAccess = "peer access is not supported between these two devices";

CudaIpcConnection::Options smallSlots() {
  CudaIpcConnection::Options o;
  o.slots = 4;
  o.slotBytes = 4096;
  return o;
}

// dst = local + incoming, in 4-byte integers.
void addInts(void* dst, const void* local, const void* incoming, size_t units, const void*) {
  auto* d = static_cast<uint32_t*>(dst);
  const auto* l = static_cast<const uint32_t*>(local);
  const auto* in = static_cast<const uint32_t*>(incoming);
  for (size_t i = 0; i < units; ++i) d[i] = l[i] + in[i];
}

// Two ends of a host connection, a stand-in device each, and the cuda_ipc
// connections over it (records in kChannel).
class DeclinedPair : public ::testing::Test {
 protected:
  void SetUp() override {
    std::tie(hostA, hostB) = transport::testing::hostPair();
    ASSERT_TRUE(hostA && hostB);
    devA = std::make_shared<FakeIpcDevice>();
    devB = std::make_shared<FakeIpcDevice>();
  }
  void TearDown() override {
    // Before the host connections they use.
    A.reset();
    B.reset();
    ipcA.reset();
    ipcB.reset();
  }
  std::unique_ptr<CudaIpcConnection> makeIpc(Connection& host, std::shared_ptr<FakeIpcDevice> dev) {
    auto made = CudaIpcConnection::createShared(host, kChannel, std::move(dev), smallSlots());
    EXPECT_TRUE(made.isOk()) << made.status().message();
    return made.isOk() ? std::move(*made) : nullptr;
  }
  void wrapBoth() {
    A = std::make_unique<IpcOrFallback>(makeIpc(*hostA, devA), *hostA);
    B = std::make_unique<IpcOrFallback>(makeIpc(*hostB, devB), *hostB);
  }
  // Drives both ends until no request is pending (or 10 s).
  void drive(Connection& a, Connection& b, std::initializer_list<RequestPtr> requests) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      (void)a.progress();
      (void)b.progress();
      bool pending = false;
      for (const auto& r : requests) pending = pending || r->state() == State::kPending;
      if (!pending) return;
    }
    ADD_FAILURE() << "requests still pending after 10 s";
  }
  static void refuseOpens(FakeIpcDevice& dev) {
    dev.beforeOpen = [] { return Status(ErrorCode::kUnhandledCudaError, kNoPeerAccess); };
  }

  std::unique_ptr<Connection> hostA, hostB;
  std::shared_ptr<FakeIpcDevice> devA, devB;
  std::unique_ptr<CudaIpcConnection> ipcA, ipcB;
  std::unique_ptr<IpcOrFallback> A, B;
};

TEST_F(DeclinedPair, BothEndsSayWhichEndCouldNotMapAndWhy) {
  refuseOpens(*devB);
  ipcA = makeIpc(*hostA, devA);
  ipcB = makeIpc(*hostB, devB);
  DeviceBuffer s(*devA, 5000), r(*devB, 5000);
  auto sent = ipcA->postSend(s.data(), 5000, Tag{1, 1});
  auto got = ipcB->postRecv(r.data(), 5000, Tag{1, 1});
  drive(*ipcA, *ipcB, {sent, got});
  ASSERT_EQ(sent->state(), State::kFailed);
  ASSERT_EQ(got->state(), State::kFailed);
  EXPECT_EQ(ipcA->mapping(), Mapping::kDeclined);
  EXPECT_EQ(ipcB->mapping(), Mapping::kDeclined);
  EXPECT_EQ(sent->error().code(), ErrorCode::kNotSupported);
  EXPECT_EQ(sent->error().message(), std::string("cuda_ipc: rank 1 cannot map this rank's GPU "
                                                 "memory: ") +
                                         kNoPeerAccess);
  EXPECT_EQ(
      got->error().message(),
      std::string("cuda_ipc: this rank cannot map the GPU memory of rank 0: ") + kNoPeerAccess);
  EXPECT_EQ(ipcB->declinedBecause().message(), got->error().message());
  EXPECT_EQ(devA->copies.load() + devB->copies.load(), 0u);

  // Declined is not broken: the host connection goes on, and nothing of
  // the handshake is left on it.
  std::vector<uint8_t> out(3000, 7), in(3000, 0);
  auto hs = hostA->postSend(out.data(), out.size(), Tag{1, 1});
  auto hr = hostB->postRecv(in.data(), in.size(), Tag{1, 1});
  drive(*hostA, *hostB, {hs, hr});
  ASSERT_EQ(hr->state(), State::kDone) << hr->error().message();
  EXPECT_EQ(in, out);
  EXPECT_FALSE(hostA->unclaimed(kChannel, ~uint64_t{0}).has_value());
  EXPECT_FALSE(hostB->unclaimed(kChannel, ~uint64_t{0}).has_value());
}

// An abort of a declined connection still ends the host connection under
// it and tells the peer: an abort that raced the decision (in IpcOrFallback)
// lands on the declined cuda_ipc connection, and the peer, which carries
// the pair over its fallback, must not wait for ever.
TEST_F(DeclinedPair, AbortingADeclinedConnectionTellsThePeer) {
  refuseOpens(*devB);
  ipcA = makeIpc(*hostA, devA);
  ipcB = makeIpc(*hostB, devB);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((ipcA->mapping() != Mapping::kDeclined || ipcB->mapping() != Mapping::kDeclined) &&
         std::chrono::steady_clock::now() < until) {
    (void)ipcA->progress();
    (void)ipcB->progress();
  }
  ASSERT_EQ(ipcA->mapping(), Mapping::kDeclined);
  ipcA->abort(remoteError("rank 0 gave up"));
  std::vector<uint8_t> in(64);
  auto waiting = hostB->postRecv(in.data(), in.size(), Tag{1, 1});
  drive(*hostA, *hostB, {waiting});
  ASSERT_EQ(waiting->state(), State::kFailed);
  EXPECT_NE(hostB->peerFailure().message().find("rank 0 gave up"), std::string::npos)
      << hostB->peerFailure().message();
}

TEST_F(DeclinedPair, WhereOneEndCannotMapBothCarryThePairOverTheFallback) {
  refuseOpens(*devA);
  wrapBoth();
  const size_t count = 7000, bytes = count * 4;  // several slots, had cuda_ipc carried them
  DeviceBuffer s(*devA, bytes), r(*devB, bytes), s2(*devB, bytes), local(*devA, bytes),
      dst(*devA, bytes);
  s.fill(4);
  auto* sv = reinterpret_cast<uint32_t*>(s2.data());
  auto* lv = reinterpret_cast<uint32_t*>(local.data());
  for (size_t i = 0; i < count; ++i) sv[i] = static_cast<uint32_t>(i), lv[i] = 500000;
  const Combiner adder{4, &addInts, nullptr};
  // Posted before the handshake decided: queued, then forwarded.
  auto sent = A->postSend(s.data(), bytes, Tag{1, 1});
  auto got = B->postRecv(r.data(), bytes, Tag{1, 1});
  auto reduced = A->postRecvReduce(dst.data(), local.data(), bytes, Tag{2, 1}, adder);
  auto sentBack = B->postSend(s2.data(), bytes, Tag{2, 1});
  EXPECT_FALSE(A->fellBack());
  drive(*A, *B, {sent, got, reduced, sentBack});
  for (const auto& q : {sent, got, reduced, sentBack})
    ASSERT_EQ(q->state(), State::kDone) << q->error().message();
  EXPECT_TRUE(A->fellBack());
  EXPECT_TRUE(B->fellBack());
  EXPECT_TRUE(r.holds(4));
  auto* dv = reinterpret_cast<uint32_t*>(dst.data());
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(dv[i], 500000 + i) << i;

  // Posted after: straight to the fallback.
  s.fill(9);
  auto later = A->postSend(s.data(), bytes, Tag{3, 1});
  auto laterIn = B->postRecv(r.data(), bytes, Tag{3, 1});
  drive(*A, *B, {later, laterIn});
  ASSERT_EQ(laterIn->state(), State::kDone) << laterIn->error().message();
  EXPECT_TRUE(r.holds(9));
  // No byte crossed through the devices' slots.
  EXPECT_EQ(devA->copies.load() + devB->copies.load(), 0u);
  EXPECT_EQ(devA->combines.load(), 0u);
}

TEST_F(DeclinedPair, WhereBothCanMapThePairStaysOnCudaIpc) {
  wrapBoth();
  DeviceBuffer s(*devA, 20000), r(*devB, 20000);
  s.fill(5);
  auto sent = A->postSend(s.data(), 20000, Tag{1, 1});
  auto got = B->postRecv(r.data(), 20000, Tag{1, 1});
  drive(*A, *B, {sent, got});
  ASSERT_EQ(got->state(), State::kDone) << got->error().message();
  EXPECT_TRUE(devB->synchronize().isOk());
  EXPECT_TRUE(r.holds(5));
  EXPECT_FALSE(A->fellBack());
  EXPECT_FALSE(B->fellBack());
  EXPECT_GT(devA->copies.load(), 0u);
}

// reserve() reaches the connection the pair chose, and nothing while it is
// undecided: the fallback would pin buffers of whole messages, kept until
// the communicator goes, for a pair that most likely maps.
TEST_F(DeclinedPair, ReservePinsOnTheFallbackOnlyOnceThePairFellBack) {
  refuseOpens(*devA);
  gpu_staged::StagedConnection::Options options;
  options.minBounceBytes = 4096;
  gpu_staged::StagedConnection stagedA(*hostA, devA, options), stagedB(*hostB, devB, options);
  A = std::make_unique<IpcOrFallback>(makeIpc(*hostA, devA), stagedA);
  B = std::make_unique<IpcOrFallback>(makeIpc(*hostB, devB), stagedB);
  const std::vector<size_t> sizes = {10000};
  ASSERT_TRUE(A->reserve(sizes, sizes).isOk());
  EXPECT_EQ(stagedA.bounceBuffers(), 0u);
  DeviceBuffer s(*devA, 20000), r(*devB, 20000);
  auto sent = A->postSend(s.data(), 20000, Tag{1, 1});
  auto got = B->postRecv(r.data(), 20000, Tag{1, 1});
  drive(*A, *B, {sent, got});
  ASSERT_EQ(got->state(), State::kDone) << got->error().message();
  ASSERT_TRUE(A->fellBack());
  EXPECT_EQ(stagedA.bounceBuffers(), 1u);  // the send's, pinned as it was posted
  ASSERT_TRUE(A->reserve(sizes, sizes).isOk());
  EXPECT_EQ(stagedA.bounceBuffers(), 2u);  // the send's fits; one for receives
  // Before the fallbacks they use.
  A.reset();
  B.reset();
}

TEST_F(DeclinedPair, AbortBeforeTheHandshakeDecidedFailsWhatWaits) {
  refuseOpens(*devA);
  wrapBoth();
  DeviceBuffer r(*devA, 64), s(*devA, 64);
  auto waiting = A->postRecv(r.data(), 64, Tag{1, 1});
  A->abort(remoteError("given up"));
  ASSERT_EQ(waiting->state(), State::kFailed);
  EXPECT_EQ(waiting->error().message(), "given up");
  EXPECT_EQ(A->postSend(s.data(), 64, Tag{2, 1})->state(), State::kFailed);
}

TEST_F(DeclinedPair, APeerThatLeavesDuringTheHandshakeFailsWhatWaitsWithItsReason) {
  wrapBoth();
  devA->beforeOpen = [this] {
    B->abort(Status(ErrorCode::kUnhandledCudaError, "the peer's own reason"));
    return remoteError("the exporter is gone");
  };
  DeviceBuffer r(*devA, 64);
  auto waiting = A->postRecv(r.data(), 64, Tag{1, 1});
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (waiting->state() == State::kPending && std::chrono::steady_clock::now() < until) {
    (void)B->progress();
    (void)A->progress();
  }
  ASSERT_EQ(waiting->state(), State::kFailed);
  EXPECT_NE(waiting->error().message().find("the peer's own reason"), std::string::npos)
      << waiting->error().message();
  EXPECT_FALSE(A->fellBack());
}

}  // namespace
}  // namespace braid::transport::cuda_ipc
