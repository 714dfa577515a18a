// The fault-injecting transport (transports/faulty): each kind of fault does
// what it says, over a socket and over shared-memory rings, and a seed names
// the same faults every time.
#include "transports/faulty/faulty_connection.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <numeric>
#include <thread>

#include "transports/shm/shm_stream.h"
#include "transports/stream_connection.h"
#include "transports/tcp/socket_stream.h"

namespace braid::transport::faulty {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kRingBytes = 64 << 10;

// Counts the bytes read through it: what the receiving end saw before a cut.
class CountingStream final : public ByteStream {
 public:
  explicit CountingStream(std::unique_ptr<ByteStream> inner) : inner_(std::move(inner)) {}
  Result<size_t> writeSome(const iovec* iov, int count) override {
    return inner_->writeSome(iov, count);
  }
  Result<size_t> readSome(void* into, size_t room) override {
    auto got = inner_->readSome(into, room);
    if (got.isOk()) bytesRead += *got;
    return got;
  }
  void writeLast(const iovec* iov, int count) override { inner_->writeLast(iov, count); }
  void close() override { inner_->close(); }
  int pollFd() const override { return inner_->pollFd(); }
  bool pollForWrite(bool sendsPending) const override { return inner_->pollForWrite(sendsPending); }
  bool prepareToSleep(bool sendsPending) override { return inner_->prepareToSleep(sendsPending); }

  size_t bytesRead = 0;

 private:
  std::unique_ptr<ByteStream> inner_;
};

// Rank 0 (`a`, with faults) and rank 1 (`b`, without) of one connection.
struct Pair {
  std::unique_ptr<Connection> a;
  std::unique_ptr<StreamConnection> b;
  FaultyConnection* faulty = nullptr;
  CountingStream* received = nullptr;  // b's stream

  Pair(const std::string& kind, const FaultSpec& spec, bool withStream = true) {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    std::unique_ptr<ByteStream> sa, sb;
    if (kind == "tcp") {
      sa = std::make_unique<tcp::SocketStream>(tcp::Fd(fds[0]), 1);
      sb = std::make_unique<tcp::SocketStream>(tcp::Fd(fds[1]), 0);
    } else {
      auto created = shm::Segment::create(shm::segmentBytes(kRingBytes));
      EXPECT_TRUE(created.isOk()) << created.status().message();
      shm::ShmStream::initialize(*created, kRingBytes);
      auto opened = shm::Segment::open(created->name(), shm::segmentBytes(kRingBytes));
      EXPECT_TRUE(opened.isOk()) << opened.status().message();
      created->unlink();
      sa = std::make_unique<shm::ShmStream>(std::move(*created), kRingBytes, true, tcp::Fd(fds[0]),
                                            1);
      sb = std::make_unique<shm::ShmStream>(std::move(*opened), kRingBytes, false, tcp::Fd(fds[1]),
                                            0);
    }
    FaultyStream* cutter = withStream ? wrapStream(sa, spec, 1) : nullptr;
    a = std::make_unique<StreamConnection>(std::move(sa), 1);
    wrapConnection(a, cutter, spec, 0);
    faulty = dynamic_cast<FaultyConnection*>(a.get());
    auto counting = std::make_unique<CountingStream>(std::move(sb));
    received = counting.get();
    b = std::make_unique<StreamConnection>(std::move(counting), 0);
  }

  // Drives both ends until no request is pending, or `limit` passes.
  bool drive(std::initializer_list<RequestPtr> requests,
             std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    return driveAll(std::vector<RequestPtr>(requests), limit);
  }
  bool driveAll(const std::vector<RequestPtr>& requests,
                std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      (void)a->progress();
      (void)b->progress();
      bool pending = false;
      for (const auto& r : requests) pending = pending || r->state() == Request::State::kPending;
      if (!pending) return true;
    }
    return false;
  }
};

FaultSpec spec(double drop, double delay, double close, uint64_t seed = 7, double delayMs = 10) {
  FaultSpec s;
  s.drop = drop;
  s.delay = delay;
  s.close = close;
  s.seed = seed;
  s.delayMs = delayMs;
  return s;
}

// The dice of rank 0's connection to rank 1, as FaultyConnection makes them.
FaultDice diceOf(const FaultSpec& s) {
  return FaultDice(s, uint64_t{0} << 32 | 1);
}

Tag tag(uint64_t value) {
  return {value, 7};
}

TEST(FaultDice, TheSameSeedDrawsTheSameFaults) {
  const FaultSpec s = spec(0.1, 0.2, 0.05);
  FaultDice one(s, 5), two(s, 5), otherSeed(spec(0.1, 0.2, 0.05, 8), 5), otherStream(s, 6);
  int differentSeed = 0, differentStream = 0;
  for (int i = 0; i < 10000; ++i) {
    const Fault a = one.next(i), b = two.next(i);
    ASSERT_EQ(a.kind, b.kind) << "message " << i;
    ASSERT_EQ(a.delay, b.delay);
    ASSERT_EQ(a.cutAfter, b.cutAfter);
    differentSeed += otherSeed.next(i).kind != a.kind;
    differentStream += otherStream.next(i).kind != a.kind;
  }
  EXPECT_GT(differentSeed, 1000);
  EXPECT_GT(differentStream, 1000);
}

TEST(FaultDice, RatesAndRangesAreAsSpecified) {
  FaultDice dice(spec(0.1, 0.2, 0.05, 3, 20), 0);
  const int n = 200000;
  int drops = 0, delays = 0, cuts = 0;
  for (int i = 0; i < n; ++i) {
    const size_t bytes = static_cast<size_t>(i % 1000);
    const Fault f = dice.next(bytes);
    switch (f.kind) {
      case Fault::Kind::kDrop:
        ++drops;
        break;
      case Fault::Kind::kTruncate:
        ++drops;
        ASSERT_LT(f.keep, bytes);
        break;
      case Fault::Kind::kDelay:
        ++delays;
        ASSERT_GE(f.delay.count(), 1);
        ASSERT_LE(f.delay.count(), 20000);
        break;
      case Fault::Kind::kCut:
        ++cuts;
        ASSERT_LE(f.cutAfter, bytes);
        break;
      case Fault::Kind::kNone:
        break;
    }
  }
  EXPECT_NEAR(drops / double(n), 0.1, 0.005);
  EXPECT_NEAR(delays / double(n), 0.2, 0.005);
  EXPECT_NEAR(cuts / double(n), 0.05, 0.005);
}

TEST(FaultyConnection, NothingIsWrappedWithoutFaults) {
  Pair p("tcp", FaultSpec{});
  EXPECT_EQ(p.faulty, nullptr);
  int x = 5, y = 0;
  RequestPtr s = p.a->postSend(&x, 4, tag(1));
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  ASSERT_TRUE(p.drive({s, r}));
  EXPECT_EQ(y, 5);
}

class Faults : public ::testing::TestWithParam<std::string> {};

TEST_P(Faults, DroppedMessagesNeverArriveOrArriveShort) {
  const FaultSpec s = spec(0.3, 0, 0);
  Pair p(GetParam(), s);
  FaultDice dice = diceOf(s);
  const int n = 200;
  std::vector<uint32_t> out(n), in(n, 0);
  std::iota(out.begin(), out.end(), 1000);
  std::vector<RequestPtr> sends, recvs;
  std::vector<Fault::Kind> kinds(n);
  for (int i = 0; i < n; ++i) {
    kinds[i] = dice.next(4).kind;
    recvs.push_back(p.b->postRecv(&in[i], 4, tag(i + 1)));
    sends.push_back(p.a->postSend(&out[i], 4, tag(i + 1)));
    // The sender is told a dropped message was sent.
    if (kinds[i] == Fault::Kind::kDrop) {
      EXPECT_EQ(sends.back()->state(), Request::State::kDone);
    }
  }
  int last = n - 1;
  while (kinds[last] == Fault::Kind::kDrop) --last;
  p.driveAll({recvs.begin(), recvs.begin() + last + 1});
  int drops = 0, truncations = 0;
  for (int i = 0; i <= last; ++i) {
    SCOPED_TRACE(i);
    if (kinds[i] == Fault::Kind::kDrop) {
      ++drops;
      // The next message overtakes it: the peer seems to have moved on.
      ASSERT_EQ(recvs[i]->state(), Request::State::kFailed);
      EXPECT_EQ(recvs[i]->failure(), Request::Failure::kOvertaken);
    } else if (kinds[i] == Fault::Kind::kTruncate) {
      ++truncations;
      ASSERT_EQ(recvs[i]->state(), Request::State::kFailed);
      EXPECT_EQ(recvs[i]->failure(), Request::Failure::kDifferentCall);
      EXPECT_NE(recvs[i]->error().message().find("4 expected"), std::string::npos)
          << recvs[i]->error().message();
    } else {
      ASSERT_EQ(recvs[i]->state(), Request::State::kDone);
      EXPECT_EQ(in[i], out[i]);
    }
  }
  EXPECT_GT(drops, 15);
  EXPECT_GT(truncations, 15);
  const auto counts = p.faulty->counts();
  EXPECT_EQ(counts.dropped,
            static_cast<uint64_t>(std::count(kinds.begin(), kinds.end(), Fault::Kind::kDrop)));
  EXPECT_EQ(counts.truncated, static_cast<uint64_t>(truncations));
  // A dropped last message is simply never there.
  for (int i = last + 1; i < n; ++i) EXPECT_EQ(recvs[i]->state(), Request::State::kPending);
}

TEST_P(Faults, DelayedMessagesArriveLateAndInOrder) {
  const FaultSpec s = spec(0, 0.3, 0, 11, 20);
  Pair p(GetParam(), s);
  FaultDice dice = diceOf(s);
  const int n = 100;
  std::vector<uint32_t> out(n), in(n, 0);
  std::iota(out.begin(), out.end(), 1);
  std::vector<RequestPtr> sends, recvs;
  std::chrono::microseconds held{0};
  for (int i = 0; i < n; ++i) {
    const Fault f = dice.next(4);
    if (f.kind == Fault::Kind::kDelay) held = std::max(held, f.delay);
    recvs.push_back(p.b->postRecv(&in[i], 4, tag(i + 1)));
  }
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) sends.push_back(p.a->postSend(&out[i], 4, tag(i + 1)));
  ASSERT_GT(held.count(), 1000);
  std::vector<RequestPtr> all = sends;
  all.insert(all.end(), recvs.begin(), recvs.end());
  ASSERT_TRUE(p.driveAll(all));
  // Never before the longest hold: every message queues behind held ones.
  EXPECT_GE(Clock::now() - start, held);
  for (int i = 0; i < n; ++i) {
    // A message that overtook an earlier one would fail that one's receive.
    ASSERT_EQ(recvs[i]->state(), Request::State::kDone) << "message " << i;
    EXPECT_EQ(in[i], out[i]);
  }
  EXPECT_GT(p.faulty->counts().delayed, 15u);
}

TEST_P(Faults, AHeldMessageWakesASleeperWhenDue) {
  // Delays up to 2 s (this one draws about 0.8 s): the sender must look for
  // its next due time before the message is due, however slow the machine.
  const FaultSpec s = spec(0, 1, 0, 5, 2000);
  Pair p(GetParam(), s);
  const Fault f = diceOf(s).next(4);
  ASSERT_EQ(f.kind, Fault::Kind::kDelay);
  int x = 3, y = 0;
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  const auto start = Clock::now();
  RequestPtr sent = p.a->postSend(&x, 4, tag(1));
  EXPECT_EQ(sent->state(), Request::State::kPending);
  ASSERT_TRUE(p.a->prepareToSleep()) << "nothing is due yet";
  EXPECT_FALSE(p.a->wantsWrite());
  pollfd fd{p.a->pollFd(), POLLIN, 0};
  ASSERT_EQ(::poll(&fd, 1, 5000), 1) << "the timer woke the caller";
  const auto woke = Clock::now() - start;
  EXPECT_GE(woke, f.delay);
  EXPECT_LT(woke, f.delay + std::chrono::seconds(2));
  ASSERT_TRUE(p.drive({sent, r}));
  EXPECT_EQ(y, 3);
}

TEST_P(Faults, ACutEndsTheStreamInsideTheMessageWithNoGoodbye) {
  // Many seeds, so the cut falls at many places: in the header, in the
  // payload, at the very end.
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    const FaultSpec s = spec(0, 0, 1, seed);
    Pair p(GetParam(), s);
    const Fault f = diceOf(s).next(1000);
    ASSERT_EQ(f.kind, Fault::Kind::kCut);
    std::vector<uint8_t> out(1000, 9), in(1000);
    RequestPtr r = p.b->postRecv(in.data(), in.size(), tag(1));
    RequestPtr sent = p.a->postSend(out.data(), out.size(), tag(1));
    ASSERT_TRUE(p.drive({sent, r}));
    ASSERT_EQ(sent->state(), Request::State::kFailed);
    EXPECT_EQ(sent->error().code(), ErrorCode::kRemoteError);
    EXPECT_NE(sent->error().message().find("injected fault"), std::string::npos)
        << sent->error().message();
    ASSERT_EQ(r->state(), Request::State::kFailed);
    EXPECT_EQ(r->error().code(), ErrorCode::kRemoteError);
    EXPECT_NE(r->error().message().find("closed the connection"), std::string::npos)
        << "the peer sees an end of stream, not a goodbye: " << r->error().message();
    EXPECT_TRUE(p.b->peerFailure().isOk());
    EXPECT_EQ(p.received->bytesRead, f.cutAfter) << "exactly the bytes before the cut";
    EXPECT_EQ(p.faulty->counts().cut, 1u);
    // Later sends fail at once, as on any dead connection.
    RequestPtr later = p.a->postSend(out.data(), 4, tag(2));
    ASSERT_TRUE(p.drive({later}));
    EXPECT_EQ(later->state(), Request::State::kFailed);
  }
}

TEST_P(Faults, ACutWithoutAStreamClosesTheConnection) {
  Pair p(GetParam(), spec(0, 0, 1), /*withStream=*/false);
  int x = 1, y = 0;
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  RequestPtr sent = p.a->postSend(&x, 4, tag(1));
  ASSERT_TRUE(p.drive({sent, r}));
  EXPECT_EQ(sent->state(), Request::State::kFailed);
  EXPECT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kRemoteError);
}

TEST_P(Faults, AbortFailsHeldMessages) {
  Pair p(GetParam(), spec(0, 1, 0, 1, 60000));
  int x = 1;
  RequestPtr sent = p.a->postSend(&x, 4, tag(1));
  EXPECT_EQ(sent->state(), Request::State::kPending);
  p.a->abort(remoteError("test over"));
  EXPECT_EQ(sent->state(), Request::State::kFailed);
}

INSTANTIATE_TEST_SUITE_P(Streams, Faults, ::testing::Values("tcp", "shm"),
                         [](const auto& param) { return param.param; });

}  // namespace
}  // namespace braid::transport::faulty
