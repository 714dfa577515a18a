// The connection contract, over each byte stream: tagged matching in any
// order, direct and staged payloads, mismatch detection, and failure when the
// peer goes away. Every test runs over a socket pair, over shared-memory
// rings, and over rings whose large messages are copied once from the
// sender's memory (shm_cma; in one process the peer's memory is our own).
// The tests after the contract cover sleeping, a killed peer, and the
// single-copy protocol's own cases.
#include "transports/stream_connection.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "src/common/strcat.h"
#include "transports/shm/shm_stream.h"
#include "transports/tcp/socket_stream.h"

namespace braid::transport {
namespace {

constexpr size_t kRingBytes = 64 << 10;  // small, so large messages wrap many times

// Whether this process may read its own memory with process_vm_readv (a
// seccomp profile can forbid the call outright).
bool selfReadable() {
  static const bool readable = [] {
    uint64_t word = 42, got = 0;
    iovec local{&got, sizeof(got)}, remote{&word, sizeof(word)};
    return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == sizeof(got) && got == 42;
  }();
  return readable;
}

// Forwards to a real stream, counting what readPeer() copies; it can also
// refuse every readPeer(), as a peer that vanished or a kernel that forbids
// it would.
class TestStream final : public ByteStream {
 public:
  explicit TestStream(std::unique_ptr<ByteStream> inner) : inner_(std::move(inner)) {}
  Result<size_t> writeSome(const iovec* iov, int count) override {
    return inner_->writeSome(iov, count);
  }
  Result<size_t> readSome(void* into, size_t room) override { return inner_->readSome(into, room); }
  void writeLast(const iovec* iov, int count) override { inner_->writeLast(iov, count); }
  void close() override { inner_->close(); }
  int pollFd() const override { return inner_->pollFd(); }
  bool pollForWrite(bool sendsPending) const override { return inner_->pollForWrite(sendsPending); }
  bool prepareToSleep(bool sendsPending) override { return inner_->prepareToSleep(sendsPending); }
  bool canReadPeer() const override { return inner_->canReadPeer(); }
  std::optional<uint64_t> peerReadKey(const void* data, size_t bytes) override {
    if (refuseKeys) return std::nullopt;
    const auto key = inner_->peerReadKey(data, bytes);
    return key ? std::optional<uint64_t>(*key + keyOffset) : std::nullopt;
  }
  Status readPeer(void* into, uint64_t address, uint64_t key, size_t bytes) override {
    if (failReads) return errnoStatus("process_vm_readv", EPERM);
    ++reads;
    bytesRead += bytes;
    keysSeen.push_back(key);
    return inner_->readPeer(into, address, key - keyOffset, bytes);
  }

  size_t reads = 0, bytesRead = 0;
  bool failReads = false;
  bool refuseKeys = false;  // as RDMA for a buffer nobody declared
  uint64_t keyOffset = 0;   // added to the inner stream's keys, as a registration's would be
  std::vector<uint64_t> keysSeen;

 private:
  std::unique_ptr<ByteStream> inner_;
};

// Options under which a descriptor waits for its receive as long as a test runs.
StreamConnection::Options patient() {
  StreamConnection::Options options;
  options.unclaimedDescriptorWait = std::chrono::hours(1);
  return options;
}

// Both ends of one connection, in this process. For shm and shm_cma the
// streams are TestStreams (as, bs), owned by the connections.
struct Pair {
  std::unique_ptr<StreamConnection> a, b;
  TestStream *as = nullptr, *bs = nullptr;
  explicit Pair(const std::string& kind, StreamConnection::Options options = {}) {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    if (kind == "tcp") {
      a = std::make_unique<StreamConnection>(
          std::make_unique<tcp::SocketStream>(tcp::Fd(fds[0]), 1), 1, options);
      b = std::make_unique<StreamConnection>(
          std::make_unique<tcp::SocketStream>(tcp::Fd(fds[1]), 0), 0, options);
      return;
    }
    auto created = shm::Segment::create(shm::segmentBytes(kRingBytes));
    EXPECT_TRUE(created.isOk()) << created.status().message();
    shm::ShmStream::initialize(*created, kRingBytes);
    auto opened = shm::Segment::open(created->name(), shm::segmentBytes(kRingBytes));
    EXPECT_TRUE(opened.isOk()) << opened.status().message();
    created->unlink();
    auto sa =
        std::make_unique<shm::ShmStream>(std::move(*created), kRingBytes, true, tcp::Fd(fds[0]), 1);
    auto sb =
        std::make_unique<shm::ShmStream>(std::move(*opened), kRingBytes, false, tcp::Fd(fds[1]), 0);
    if (kind == "shm_cma") {
      sa->enableReadPeer(::getpid());
      sb->enableReadPeer(::getpid());
    }
    auto ta = std::make_unique<TestStream>(std::move(sa));
    auto tb = std::make_unique<TestStream>(std::move(sb));
    as = ta.get();
    bs = tb.get();
    a = std::make_unique<StreamConnection>(std::move(ta), 1, options);
    b = std::make_unique<StreamConnection>(std::move(tb), 0, options);
  }
  // Drives both ends until every request is no longer pending (or 5 s).
  void drive(std::initializer_list<RequestPtr> requests) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      if (a) (void)a->progress();
      if (b) (void)b->progress();
      bool pending = false;
      for (const auto& r : requests) pending = pending || r->state() == Request::State::kPending;
      if (!pending) return;
    }
    ADD_FAILURE() << "requests still pending after 5 s";
  }
};

class Connection : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "shm_cma" && !selfReadable())
      GTEST_SKIP() << "process_vm_readv is not permitted here";
  }
};

Tag tag(uint64_t value, uint64_t check = 7) {
  return {value, check};
}

TEST_P(Connection, MatchesReceivesPostedInAnyOrder) {
  Pair p(GetParam());
  std::vector<int> out[3] = {{1, 2}, {3, 4, 5}, {6}};
  std::vector<int> in[3] = {std::vector<int>(2), std::vector<int>(3), std::vector<int>(1)};
  RequestPtr r2 = p.b->postRecv(in[2].data(), 4, tag(3));
  RequestPtr r0 = p.b->postRecv(in[0].data(), 8, tag(1));
  RequestPtr s0 = p.a->postSend(out[0].data(), 8, tag(1));
  RequestPtr s1 = p.a->postSend(out[1].data(), 12, tag(2));
  RequestPtr s2 = p.a->postSend(out[2].data(), 4, tag(3));
  p.drive({s0, s1, s2, r0, r2});
  // Message 2 arrived before its receive was posted: it waits as unexpected.
  RequestPtr r1 = p.b->postRecv(in[1].data(), 12, tag(2));
  EXPECT_EQ(r1->state(), Request::State::kDone);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(in[i], out[i]);
}

TEST_P(Connection, MovesLargeMessagesBothWays) {
  Pair p(GetParam());
  std::vector<uint8_t> big(8 << 20), back(8 << 20), got(8 << 20), gotBack(8 << 20);
  std::iota(big.begin(), big.end(), 0);
  std::iota(back.begin(), back.end(), 7);
  RequestPtr s1 = p.a->postSend(big.data(), big.size(), tag(1));
  RequestPtr s2 = p.b->postSend(back.data(), back.size(), tag(1));
  RequestPtr r1 = p.b->postRecv(got.data(), got.size(), tag(1));
  RequestPtr r2 = p.a->postRecv(gotBack.data(), gotBack.size(), tag(1));
  p.drive({s1, s2, r1, r2});
  EXPECT_EQ(got, big);
  EXPECT_EQ(gotBack, back);
  if (GetParam() == "shm_cma") {
    EXPECT_EQ(p.bs->bytesRead, big.size()) << "copied once, from the sender's memory";
    EXPECT_EQ(p.as->bytesRead, back.size());
  } else if (p.as) {
    EXPECT_EQ(p.as->bytesRead + p.bs->bytesRead, 0u);
  }
}

// The kernels load whole elements, so a combiner must never see a
// misaligned element, even after frames of odd sizes in the staging buffer.
std::atomic<int> misalignedCombines{0};
void addInt32Checked(void* dst, const void* local, const void* incoming, size_t units,
                     const void*) {
  for (const void* p : {static_cast<const void*>(dst), local, incoming})
    if (reinterpret_cast<uintptr_t>(p) % alignof(int32_t) != 0) ++misalignedCombines;
  for (size_t i = 0; i < units; ++i) {
    int32_t a, b;
    std::memcpy(&a, static_cast<const uint8_t*>(local) + 4 * i, 4);
    std::memcpy(&b, static_cast<const uint8_t*>(incoming) + 4 * i, 4);
    const int32_t sum = a + b;
    std::memcpy(static_cast<uint8_t*>(dst) + 4 * i, &sum, 4);
  }
}

TEST_P(Connection, CombinerSeesAlignedElementsAfterOddFrames) {
  Pair p(GetParam());
  misalignedCombines = 0;
  uint8_t odd[3] = {1, 2, 3}, oddIn[3] = {};
  std::vector<int32_t> out(1000), local(1000), result(1000);
  std::iota(out.begin(), out.end(), 0);
  std::iota(local.begin(), local.end(), 7);
  // Posted first, so the payload is combined straight from the staging
  // buffer, 3 bytes after a frame boundary.
  RequestPtr r1 = p.b->postRecv(oddIn, sizeof oddIn, tag(1));
  RequestPtr r2 = p.b->postRecvReduce(result.data(), local.data(), 4 * result.size(), tag(2),
                                      {4, &addInt32Checked, nullptr});
  RequestPtr s1 = p.a->postSend(odd, sizeof odd, tag(1));
  RequestPtr s2 = p.a->postSend(out.data(), 4 * out.size(), tag(2));
  p.drive({s1, s2, r1, r2});
  ASSERT_EQ(r2->state(), Request::State::kDone);
  for (size_t i = 0; i < result.size(); ++i) ASSERT_EQ(result[i], out[i] + local[i]);
  EXPECT_EQ(misalignedCombines.load(), 0);
}

TEST_P(Connection, ZeroByteMessages) {
  Pair p(GetParam());
  RequestPtr s = p.a->postSend(nullptr, 0, tag(9));
  RequestPtr r = p.b->postRecv(nullptr, 0, tag(9));
  p.drive({s, r});
  EXPECT_EQ(r->state(), Request::State::kDone);
}

TEST_P(Connection, DifferentCheckFailsWithTheSendersCheck) {
  Pair p(GetParam());
  int x = 1, y = 0;
  RequestPtr r = p.b->postRecv(&y, 4, tag(1, 100));
  RequestPtr s = p.a->postSend(&x, 4, tag(1, 200));
  p.drive({s, r});
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kInvalidUsage);
  EXPECT_EQ(r->mismatch().check, 200u);
}

TEST_P(Connection, DifferentSizeFails) {
  Pair p(GetParam());
  int x[2] = {1, 2}, y[4] = {};
  RequestPtr s = p.a->postSend(x, 8, tag(1));
  RequestPtr r = p.b->postRecv(y, 16, tag(1));
  p.drive({s, r});
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kInvalidUsage);
}

TEST_P(Connection, ReceiveOvertakenInItsChannelFails) {
  Pair p(GetParam());
  int x = 1, y = 0, z = 0;
  // The sender skipped tag 5 of channel 0 and went on to tag 6.
  RequestPtr waiting = p.b->postRecv(&y, 4, tag(5));
  RequestPtr s = p.a->postSend(&x, 4, tag(6));
  RequestPtr other = p.b->postRecv(&z, 4, tag((uint64_t{2} << 56) | 1));
  p.drive({s, waiting});
  EXPECT_EQ(waiting->state(), Request::State::kFailed);
  EXPECT_EQ(other->state(), Request::State::kPending) << "another channel is unaffected";
  RequestPtr late = p.b->postRecv(&y, 4, tag(4));
  EXPECT_EQ(late->state(), Request::State::kFailed)
      << "a receive posted after the overtake fails at once";
}

TEST_P(Connection, PeerClosingFailsPendingRequests) {
  Pair p(GetParam());
  int y = 0;
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  p.a.reset();
  p.drive({r});
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kRemoteError);
  EXPECT_NE(r->error().message().find("rank 0"), std::string::npos) << r->error().message();
}

TEST_P(Connection, AbortFailsPendingAndLaterRequests) {
  Pair p(GetParam());
  int y = 0;
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  p.b->abort(invalidUsage("communicator aborted"));
  EXPECT_EQ(r->state(), Request::State::kFailed);
  RequestPtr later = p.b->postSend(&y, 4, tag(2));
  EXPECT_EQ(later->state(), Request::State::kFailed);
  EXPECT_EQ(later->error().code(), ErrorCode::kInvalidUsage);
}

// A goodbye's reason comes from the peer and may be empty; the error it
// becomes must still say something (found by fuzzing).
TEST_P(Connection, PeerMismatchWithoutAReasonStillExplains) {
  Pair p(GetParam());
  int y = 0;
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  p.a->abort(invalidUsage(""));
  p.drive({r});
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kInvalidUsage);
  EXPECT_NE(r->error().message().find("rank 0"), std::string::npos) << r->error().message();
}

TEST_P(Connection, MessageThatArrivedBeforeThePeerClosedIsDelivered) {
  Pair p(GetParam());
  int x = 42, y = 0;
  RequestPtr s = p.a->postSend(&x, 4, tag(1));
  p.drive({s});
  p.a.reset();
  // Reading sees the message, then the end of the stream.
  for (int i = 0; i < 100; ++i) (void)p.b->progress();
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  EXPECT_EQ(r->state(), Request::State::kDone);
  EXPECT_EQ(y, 42);
}

// Large messages with no receive posted yet are kept whole while the
// buffer that holds them grows with what arrives (or, as descriptors, is
// copied out of the sender once they go unclaimed).
TEST_P(Connection, LargeUnexpectedMessageIsKeptWhole) {
  Pair p(GetParam());
  std::vector<uint8_t> big(5 << 20), got(big.size());
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7 + (i >> 16));
  RequestPtr s = p.a->postSend(big.data(), big.size(), tag(1));
  p.drive({s});
  ASSERT_EQ(s->state(), Request::State::kDone);
  for (int i = 0; i < 10; ++i) (void)p.b->progress();
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
  p.drive({r});
  ASSERT_EQ(r->state(), Request::State::kDone);
  EXPECT_TRUE(got == big);
}

INSTANTIATE_TEST_SUITE_P(Streams, Connection, ::testing::Values("tcp", "shm", "shm_cma"),
                         [](const auto& test) { return test.param; });

// A sleeping end is woken by the doorbell when bytes arrive.
TEST(ShmConnection, SleeperIsWokenByTheDoorbell) {
  Pair p("shm");
  int x = 5, y = 0;
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  (void)p.b->progress();
  ASSERT_TRUE(p.b->prepareToSleep()) << "nothing has arrived, so b may sleep";
  pollfd fd{p.b->pollFd(), POLLIN, 0};
  EXPECT_EQ(::poll(&fd, 1, 0), 0) << "no doorbell before anything was sent";
  RequestPtr s = p.a->postSend(&x, 4, tag(1));
  (void)p.a->progress();
  EXPECT_EQ(::poll(&fd, 1, 1000), 1) << "the sender rang";
  p.drive({s, r});
  EXPECT_EQ(y, 5);
}

// Bytes that arrive between the last progress and the sleep cancel it.
TEST(ShmConnection, BytesAlreadyThereCancelTheSleep) {
  Pair p("shm");
  int x = 5, y = 0;
  RequestPtr r = p.b->postRecv(&y, 4, tag(1));
  RequestPtr s = p.a->postSend(&x, 4, tag(1));
  (void)p.a->progress();
  EXPECT_FALSE(p.b->prepareToSleep());
  p.drive({s, r});
  EXPECT_EQ(y, 5);
}

// A writer whose ring is full sleeps until the reader makes room.
TEST(ShmConnection, FullRingWakesTheWriterWhenDrained) {
  Pair p("shm");
  std::vector<uint8_t> big(4 * kRingBytes, 3), got(4 * kRingBytes);
  RequestPtr s = p.a->postSend(big.data(), big.size(), tag(1));
  (void)p.a->progress();
  ASSERT_EQ(s->state(), Request::State::kPending) << "the ring holds only a quarter";
  ASSERT_TRUE(p.a->prepareToSleep());
  pollfd fd{p.a->pollFd(), POLLIN, 0};
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
  (void)p.b->progress();
  EXPECT_EQ(::poll(&fd, 1, 1000), 1) << "the reader rang after draining";
  p.drive({s, r});
  EXPECT_EQ(got, big);
}

// A peer process that dies without a word fails the pending receive.
TEST(ShmConnection, KilledPeerFailsPendingReceive) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  auto created = shm::Segment::create(shm::segmentBytes(kRingBytes));
  ASSERT_TRUE(created.isOk());
  shm::ShmStream::initialize(*created, kRingBytes);
  const std::string name = created->name();
  pid_t child = fork();
  if (child == 0) {
    auto opened = shm::Segment::open(name, shm::segmentBytes(kRingBytes));
    _exit(opened.isOk() ? 0 : 1);  // dies holding its end, saying nothing
  }
  ::close(fds[1]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  StreamConnection a(
      std::make_unique<shm::ShmStream>(std::move(*created), kRingBytes, true, tcp::Fd(fds[0]), 1),
      1);
  int y = 0;
  RequestPtr r = a.postRecv(&y, 4, tag(1));
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (r->state() == Request::State::kPending && std::chrono::steady_clock::now() < until) {
    (void)a.progress();
    if (a.prepareToSleep()) {
      pollfd fd{a.pollFd(), POLLIN, 0};
      (void)::poll(&fd, 1, 100);
    }
  }
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kRemoteError);
  EXPECT_NE(r->error().message().find("rank 1"), std::string::npos) << r->error().message();
}

TEST(ShmSegment, NoRoomNamesTheFix) {
  auto segment = shm::Segment::create(size_t{1} << 50);  // more than any /dev/shm
  ASSERT_FALSE(segment.isOk());
  EXPECT_NE(segment.status().message().find("--shm-size"), std::string::npos)
      << segment.status().message();
}

TEST(ShmSegment, NameIsGoneOnceUnlinked) {
  auto segment = shm::Segment::create(shm::segmentBytes(kRingBytes));
  ASSERT_TRUE(segment.isOk());
  const std::string name = segment->name();
  EXPECT_EQ(::access(("/dev/shm" + name).c_str(), F_OK), 0);
  segment->unlink();
  EXPECT_NE(::access(("/dev/shm" + name).c_str(), F_OK), 0);
  EXPECT_FALSE(shm::Segment::open(name, shm::segmentBytes(kRingBytes)).isOk());
}

// ---- Single copy: descriptors, acks, and copies from the peer's memory.

class SingleCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!selfReadable()) GTEST_SKIP() << "process_vm_readv is not permitted here";
  }
};

std::vector<uint8_t> pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 7 + seed + (i >> 12));
  return v;
}

// Progresses one end until no request is pending, sleeping on its fd as the
// engine does; false after `seconds`.
bool runUntilDone(StreamConnection& c, const std::vector<RequestPtr>& requests,
                  double seconds = 10) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    bool pending = false;
    for (const auto& r : requests) pending = pending || r->state() == Request::State::kPending;
    if (!pending) return true;
    auto moved = c.progress();
    if (moved.isOk() && *moved) continue;
    if (c.prepareToSleep()) {
      pollfd fd{c.pollFd(), POLLIN, 0};
      (void)::poll(&fd, 1, 10);
    }
  }
  return false;
}

TEST_F(SingleCopy, DescriptorWaitsUncopiedForItsReceive) {
  Pair p("shm_cma", patient());
  std::vector<uint8_t> big = pattern(3 << 20, 1), got(big.size());
  RequestPtr s = p.a->postSend(big.data(), big.size(), tag(1));
  for (int i = 0; i < 50; ++i) {
    (void)p.a->progress();
    (void)p.b->progress();
  }
  EXPECT_EQ(s->state(), Request::State::kPending) << "a send completes on the receiver's ack";
  EXPECT_EQ(p.bs->bytesRead, 0u) << "nothing is copied before the receive is posted";
  auto waiting = p.b->unclaimed(0, 2);
  ASSERT_TRUE(waiting.has_value()) << "the descriptor waits as an unexpected message";
  EXPECT_EQ(waiting->check, 7u);
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
  EXPECT_EQ(r->state(), Request::State::kPending) << "copied by progress(), in pieces";
  p.drive({s, r});
  EXPECT_EQ(r->state(), Request::State::kDone);
  EXPECT_EQ(s->state(), Request::State::kDone);
  EXPECT_EQ(got, big);
  EXPECT_EQ(p.bs->bytesRead, big.size());
  EXPECT_GE(p.bs->reads, 3u) << "at most 1 MiB per progress() call";
  EXPECT_FALSE(p.b->unclaimed(0, 2).has_value());
}

TEST_F(SingleCopy, ReceivesPostedFirstAndManyInFlight) {
  Pair p("shm_cma", patient());
  // Two messages in flight at once: the second descriptor arrives while the
  // first is being copied, and must not count as overtaking it.
  std::vector<uint8_t> one = pattern(5 << 20, 2), two = pattern((5 << 20) + 3, 3);
  std::vector<uint8_t> gotOne(one.size()), gotTwo(two.size());
  RequestPtr r1 = p.b->postRecv(gotOne.data(), gotOne.size(), tag(1));
  RequestPtr r2 = p.b->postRecv(gotTwo.data(), gotTwo.size(), tag(2));
  RequestPtr s1 = p.a->postSend(one.data(), one.size(), tag(1));
  RequestPtr s2 = p.a->postSend(two.data(), two.size(), tag(2));
  p.drive({s1, s2, r1, r2});
  EXPECT_EQ(r1->state(), Request::State::kDone);
  EXPECT_EQ(r2->state(), Request::State::kDone);
  EXPECT_EQ(gotOne, one);
  EXPECT_EQ(gotTwo, two);
}

// dst = local + incoming, byte by byte, in elements of `unit` bytes; notes
// any call that would split an element.
struct Adder {
  size_t unit = 1;
  const uint8_t* dst = nullptr;
  mutable size_t units = 0, calls = 0;
  mutable bool split = false;
  static void apply(void* dst, const void* local, const void* incoming, size_t units,
                    const void* context) {
    const auto& self = *static_cast<const Adder*>(context);
    auto* d = static_cast<uint8_t*>(dst);
    const auto* l = static_cast<const uint8_t*>(local);
    const auto* in = static_cast<const uint8_t*>(incoming);
    self.split = self.split || (d - self.dst) % self.unit != 0;
    for (size_t i = 0; i < units * self.unit; ++i) d[i] = static_cast<uint8_t>(l[i] + in[i]);
    self.units += units;
    ++self.calls;
  }
};

TEST_F(SingleCopy, ReceiveWithReductionCombinesWholeElementsInPieces) {
  for (size_t unit : {size_t{3}, size_t{12}})
    for (bool postedFirst : {true, false})
      for (bool inPlace : {false, true}) {
        SCOPED_TRACE(strCat("unit ", unit, postedFirst ? ", posted first" : ", posted late",
                            inPlace ? ", in place" : ""));
        Pair p("shm_cma", patient());
        const size_t bytes = unit * 300007;  // no multiple of the staging buffer or 1 MiB
        std::vector<uint8_t> incoming = pattern(bytes, 4), local = pattern(bytes, 9);
        std::vector<uint8_t> out(bytes), expected(bytes);
        for (size_t i = 0; i < bytes; ++i)
          expected[i] = static_cast<uint8_t>(local[i] + incoming[i]);
        uint8_t* dst = inPlace ? local.data() : out.data();
        Adder adder;
        adder.unit = unit;
        adder.dst = dst;
        const Combiner combiner{unit, &Adder::apply, &adder};
        RequestPtr r, s;
        if (postedFirst) r = p.b->postRecvReduce(dst, local.data(), bytes, tag(1), combiner);
        s = p.a->postSend(incoming.data(), bytes, tag(1));
        if (!postedFirst) {
          for (int i = 0; i < 20; ++i) {
            (void)p.a->progress();
            (void)p.b->progress();
          }
          r = p.b->postRecvReduce(dst, local.data(), bytes, tag(1), combiner);
        }
        p.drive({s, r});
        ASSERT_EQ(r->state(), Request::State::kDone);
        EXPECT_EQ(s->state(), Request::State::kDone);
        EXPECT_TRUE(std::equal(expected.begin(), expected.end(), dst));
        EXPECT_EQ(adder.units, bytes / unit);
        EXPECT_GT(adder.calls, 3u) << "combined piece by piece";
        EXPECT_FALSE(adder.split) << "a piece split an element";
        EXPECT_EQ(p.bs->bytesRead, bytes);
      }
}

TEST_F(SingleCopy, MismatchFailsTheReceiveAndReleasesTheSender) {
  Pair p("shm_cma", patient());
  std::vector<uint8_t> big = pattern(1 << 20, 5), got(2 << 20);
  // Another size, posted before the descriptor arrives.
  RequestPtr r = p.b->postRecv(got.data(), 2 << 20, tag(1));
  RequestPtr s = p.a->postSend(big.data(), big.size(), tag(1));
  p.drive({s, r});
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->failure(), Request::Failure::kDifferentCall);
  EXPECT_EQ(r->error().code(), ErrorCode::kInvalidUsage);
  EXPECT_EQ(s->state(), Request::State::kDone)
      << "as with a payload in the stream, the sender does not wait on a failed receive";
  EXPECT_TRUE(p.b->unclaimed(0, 2).has_value()) << "the message is kept as unclaimed";

  // Another check, posted after the descriptor arrived.
  RequestPtr s2 = p.a->postSend(big.data(), big.size(), tag(2, 300));
  for (int i = 0; i < 20; ++i) {
    (void)p.a->progress();
    (void)p.b->progress();
  }
  RequestPtr r2 = p.b->postRecv(got.data(), big.size(), tag(2, 100));
  ASSERT_EQ(r2->state(), Request::State::kFailed);
  EXPECT_EQ(r2->failure(), Request::Failure::kDifferentCall);
  EXPECT_EQ(r2->mismatch().check, 300u) << "the sender's check";
  p.drive({s2});
  EXPECT_EQ(s2->state(), Request::State::kDone);
}

TEST_F(SingleCopy, ReceiveOvertakenByADescriptorFails) {
  Pair p("shm_cma", patient());
  std::vector<uint8_t> big = pattern(1 << 20, 6), got(1 << 20);
  RequestPtr skipped = p.b->postRecv(got.data(), got.size(), tag(5));
  RequestPtr s = p.a->postSend(big.data(), big.size(), tag(6));
  p.drive({skipped});
  ASSERT_EQ(skipped->state(), Request::State::kFailed);
  EXPECT_EQ(skipped->failure(), Request::Failure::kOvertaken);
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(6));
  p.drive({s, r});
  EXPECT_EQ(r->state(), Request::State::kDone);
  EXPECT_EQ(got, big);
}

TEST_F(SingleCopy, AbortFailsASendWaitingForItsAck) {
  Pair p("shm_cma", patient());
  std::vector<uint8_t> big = pattern(1 << 20, 7), got(1 << 20, 0);
  RequestPtr s = p.a->postSend(big.data(), big.size(), tag(1));
  for (int i = 0; i < 5; ++i) (void)p.a->progress();
  ASSERT_EQ(s->state(), Request::State::kPending);
  p.a->abort(invalidUsage("communicator aborted"));
  ASSERT_EQ(s->state(), Request::State::kFailed);
  EXPECT_EQ(s->error().code(), ErrorCode::kInvalidUsage);
  // The receiver saw the descriptor, then the goodbye: the sender's buffer
  // is no longer promised, so the receive fails instead of copying it.
  for (int i = 0; i < 20; ++i) (void)p.b->progress();
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
  EXPECT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(p.bs->bytesRead, 0u);
}

TEST_F(SingleCopy, PeerAbortFailsASendWaitingForItsAck) {
  Pair p("shm_cma", patient());
  std::vector<uint8_t> big = pattern(1 << 20, 8);
  RequestPtr s = p.a->postSend(big.data(), big.size(), tag(1));
  for (int i = 0; i < 10; ++i) {
    (void)p.a->progress();
    (void)p.b->progress();
  }
  ASSERT_TRUE(p.b->unclaimed(0, 2).has_value());
  p.b->abort(invalidUsage("rank 1 called something else"));
  p.drive({s});
  ASSERT_EQ(s->state(), Request::State::kFailed);
  EXPECT_EQ(s->error().code(), ErrorCode::kInvalidUsage);
  EXPECT_NE(s->error().message().find("something else"), std::string::npos) << s->error().message();
}

TEST_F(SingleCopy, FailedCopyFailsBothEnds) {
  Pair p("shm_cma", patient());
  p.bs->failReads = true;  // as if the kernel forbade it, or the sender vanished
  std::vector<uint8_t> big = pattern(1 << 20, 9), got(1 << 20);
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
  RequestPtr s = p.a->postSend(big.data(), big.size(), tag(1));
  p.drive({s, r});
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kSystemError);
  ASSERT_EQ(s->state(), Request::State::kFailed) << "the sender is told, not left waiting";
  EXPECT_EQ(s->error().code(), ErrorCode::kRemoteError);
  EXPECT_NE(s->error().message().find("process_vm_readv"), std::string::npos)
      << s->error().message();
}

TEST_F(SingleCopy, StreamThatCannotReadThePeerSendsPayloads) {
  StreamConnection::Options options = patient();
  options.readPeerBytes = 1024;
  std::vector<uint8_t> data = pattern(4096, 10), got(4096);
  for (const char* kind : {"shm", "shm_cma"}) {
    SCOPED_TRACE(kind);
    const bool cma = std::string(kind) == "shm_cma";
    Pair p(kind, options);
    RequestPtr s = p.a->postSend(data.data(), data.size(), tag(1));
    for (int i = 0; i < 5; ++i) (void)p.a->progress();
    // Through the rings the send is done once written; as a descriptor it
    // waits for the receiver.
    EXPECT_EQ(s->state(), cma ? Request::State::kPending : Request::State::kDone);
    RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
    p.drive({s, r});
    EXPECT_EQ(got, data);
    EXPECT_EQ(p.bs->bytesRead, cma ? data.size() : 0u);
  }
}

// The key the sender's stream gave for a buffer reaches the receiver's
// reads of it, whether the receive was posted first or came after.
TEST_F(SingleCopy, TheSendersKeyComesWithItsDescriptor) {
  for (bool receiveFirst : {true, false}) {
    SCOPED_TRACE(receiveFirst ? "receive posted first" : "descriptor waited");
    StreamConnection::Options options = patient();
    options.readPeerBytes = 1024;
    Pair p("shm_cma", options);
    p.as->keyOffset = 0x5eed00000000;  // the sender's
    p.bs->keyOffset = 0x5eed00000000;  // and undone by the reader, as a real key would check
    std::vector<uint8_t> data = pattern(256 << 10, 14), got(data.size());
    RequestPtr r, s;
    if (receiveFirst) r = p.b->postRecv(got.data(), got.size(), tag(1));
    s = p.a->postSend(data.data(), data.size(), tag(1));
    for (int i = 0; i < 5; ++i) (void)p.a->progress(), (void)p.b->progress();
    if (!receiveFirst) r = p.b->postRecv(got.data(), got.size(), tag(1));
    p.drive({s, r});
    EXPECT_EQ(got, data);
    ASSERT_FALSE(p.bs->keysSeen.empty());
    for (uint64_t key : p.bs->keysSeen) EXPECT_EQ(key, 0x5eed00000000u);
  }
}

// A buffer the stream cannot expose (RDMA: not declared by the user) is
// sent through the stream, even over a stream that can read the peer.
TEST_F(SingleCopy, ABufferWithoutAKeyIsSentThroughTheStream) {
  StreamConnection::Options options = patient();
  options.readPeerBytes = 1024;
  Pair p("shm_cma", options);
  p.as->refuseKeys = true;
  std::vector<uint8_t> data = pattern(256 << 10, 15), got(data.size());
  RequestPtr s = p.a->postSend(data.data(), data.size(), tag(1));
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
  p.drive({s, r});
  EXPECT_EQ(got, data);
  EXPECT_EQ(p.bs->bytesRead, 0u);
}

TEST_F(SingleCopy, ShortMessagesStayInTheRings) {
  Pair p("shm_cma", patient());
  std::vector<uint8_t> data = pattern((64 << 10) - 1, 11), got(data.size());
  RequestPtr s = p.a->postSend(data.data(), data.size(), tag(1));
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
  p.drive({s, r});
  EXPECT_EQ(got, data);
  EXPECT_EQ(p.bs->bytesRead, 0u) << "below the threshold";
}

// Ranks that each send before they receive: the unclaimed descriptors are
// copied out after a while, so neither sender waits for good.
TEST_F(SingleCopy, SendsToEachOtherBeforeReceivingComplete) {
  StreamConnection::Options options;
  options.unclaimedDescriptorWait = std::chrono::milliseconds(0);
  Pair p("shm_cma", options);
  std::vector<uint8_t> ab = pattern(2 << 20, 12), ba = pattern(2 << 20, 13);
  std::vector<uint8_t> gotAb(ab.size()), gotBa(ba.size());
  RequestPtr s1 = p.a->postSend(ab.data(), ab.size(), tag(1));
  RequestPtr s2 = p.b->postSend(ba.data(), ba.size(), tag(1));
  p.drive({s1, s2});
  ASSERT_EQ(s1->state(), Request::State::kDone);
  ASSERT_EQ(s2->state(), Request::State::kDone);
  std::fill(ab.begin(), ab.end(), 0);  // the senders own their buffers again
  std::fill(ba.begin(), ba.end(), 0);
  RequestPtr r1 = p.b->postRecv(gotAb.data(), gotAb.size(), tag(1));
  RequestPtr r2 = p.a->postRecv(gotBa.data(), gotBa.size(), tag(1));
  EXPECT_EQ(r1->state(), Request::State::kDone);
  EXPECT_EQ(r2->state(), Request::State::kDone);
  EXPECT_EQ(gotAb, pattern(2 << 20, 12));
  EXPECT_EQ(gotBa, pattern(2 << 20, 13));
}

// The same two ranks about to sleep, each holding the other's descriptor:
// neither waits out the delay.
TEST_F(SingleCopy, IdleEndsHoldingEachOthersDescriptorsCopyAtOnce) {
  Pair p("shm_cma", patient());
  std::vector<uint8_t> ab = pattern(2 << 20, 16), ba = pattern(2 << 20, 17);
  std::vector<uint8_t> gotAb(ab.size()), gotBa(ba.size());
  RequestPtr s1 = p.a->postSend(ab.data(), ab.size(), tag(1));
  RequestPtr s2 = p.b->postSend(ba.data(), ba.size(), tag(1));
  for (int i = 0; i < 10; ++i) {
    (void)p.a->progress();
    (void)p.b->progress();
  }
  ASSERT_EQ(s1->state(), Request::State::kPending);
  EXPECT_FALSE(p.a->prepareToSleep());
  EXPECT_FALSE(p.b->prepareToSleep());
  p.drive({s1, s2});
  EXPECT_EQ(s1->state(), Request::State::kDone);
  EXPECT_EQ(s2->state(), Request::State::kDone);
  RequestPtr r1 = p.b->postRecv(gotAb.data(), gotAb.size(), tag(1));
  RequestPtr r2 = p.a->postRecv(gotBa.data(), gotBa.size(), tag(1));
  EXPECT_EQ(gotAb, ab);
  EXPECT_EQ(gotBa, ba);
}

// A caller progresses only the connections it has requests on; one it has
// none on is still read, and its stale descriptors copied, before it sleeps.
TEST_F(SingleCopy, IdleReceiverReleasesTheSenderBeforeItSleeps) {
  StreamConnection::Options options;
  options.unclaimedDescriptorWait = std::chrono::milliseconds(0);
  Pair p("shm_cma", options);
  std::vector<uint8_t> big = pattern(1 << 20, 18), got(big.size());
  RequestPtr s = p.a->postSend(big.data(), big.size(), tag(1));
  (void)p.a->progress();
  for (int i = 0; i < 3; ++i) (void)p.b->prepareToSleep();  // b is never progressed
  for (int i = 0; i < 10 && s->state() == Request::State::kPending; ++i) (void)p.a->progress();
  EXPECT_EQ(s->state(), Request::State::kDone);
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
  EXPECT_EQ(r->state(), Request::State::kDone);
  EXPECT_EQ(got, big);
}

// A copy acknowledged before the sender left is kept, as a payload that came
// through the stream would be.
TEST_F(SingleCopy, CopyAcknowledgedBeforeThePeerClosedIsDelivered) {
  StreamConnection::Options options;
  options.unclaimedDescriptorWait = std::chrono::milliseconds(0);
  Pair p("shm_cma", options);
  std::vector<uint8_t> big = pattern(1 << 20, 14), got(big.size());
  RequestPtr s = p.a->postSend(big.data(), big.size(), tag(1));
  p.drive({s});
  ASSERT_EQ(s->state(), Request::State::kDone);
  p.a.reset();
  for (int i = 0; i < 100; ++i) (void)p.b->progress();
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
  EXPECT_EQ(r->state(), Request::State::kDone);
  EXPECT_EQ(got, big);
}

// A copy made after the sender gave up (its goodbye was still on the way)
// may hold whatever the sender's buffer held by then: it is dropped.
TEST_F(SingleCopy, CopyNotAcknowledgedBeforeThePeerLeftIsDropped) {
  StreamConnection::Options options;
  options.unclaimedDescriptorWait = std::chrono::milliseconds(50);
  Pair p("shm_cma", options);
  std::vector<uint8_t> big = pattern(1 << 20, 15), got(big.size(), 0);
  RequestPtr s = p.a->postSend(big.data(), big.size(), tag(1));
  for (int i = 0; i < 5; ++i) (void)p.a->progress();
  (void)p.b->progress();
  ASSERT_TRUE(p.b->unclaimed(0, 2).has_value()) << "the descriptor has arrived";
  p.a->abort(invalidUsage("communicator aborted"));
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  (void)p.b->progress();  // copies the stale descriptor, then reads the goodbye
  EXPECT_EQ(p.bs->bytesRead, big.size());
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
  EXPECT_EQ(r->state(), Request::State::kFailed);
}

TEST_F(SingleCopy, NegotiationAgreesOnlyWhenBothEndsCanRead) {
  for (bool aWilling : {true, false}) {
    SCOPED_TRACE(aWilling ? "both willing" : "one end turned it off");
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    tcp::Fd fa(fds[0]), fb(fds[1]);
    Result<shm::ReadPeerVerdict> va = internalError("not run"), vb = internalError("not run");
    std::thread t([&] { vb = shm::negotiateReadPeer(fb.get(), true, Deadline::after(10)); });
    va = shm::negotiateReadPeer(fa.get(), aWilling, Deadline::after(10));
    t.join();
    ASSERT_TRUE(va.isOk()) << va.status().message();
    ASSERT_TRUE(vb.isOk()) << vb.status().message();
    EXPECT_EQ(va->peerPid, aWilling ? ::getpid() : 0);
    EXPECT_EQ(vb->peerPid, aWilling ? ::getpid() : 0);
    if (!aWilling) {
      EXPECT_NE(va->refused.find("turned off on this rank"), std::string::npos) << va->refused;
      EXPECT_NE(vb->refused.find("turned off on the peer"), std::string::npos) << vb->refused;
    }
  }
}

// A peer whose word cannot be read (here: a bad address, as when the kernel
// refuses) leaves both ends on the rings.
TEST_F(SingleCopy, NegotiationFailsWhenTheWordCannotBeRead) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  tcp::Fd fa(fds[0]), fb(fds[1]);
  std::thread fake([&] {
    // The offer's wire format: willing, pid, address, value.
    const uint64_t offer[4] = {1, static_cast<uint64_t>(::getpid()), 0, 42};
    uint64_t theirs[4];
    uint8_t canRead = 1, peerCanRead = 0;
    const Deadline d = Deadline::after(10);
    (void)tcp::sendAll(fb.get(), {reinterpret_cast<const uint8_t*>(offer), sizeof(offer)}, d);
    (void)tcp::recvAll(fb.get(), {reinterpret_cast<uint8_t*>(theirs), sizeof(theirs)}, d);
    (void)tcp::sendAll(fb.get(), {&canRead, 1}, d);
    (void)tcp::recvAll(fb.get(), {&peerCanRead, 1}, d);
  });
  auto verdict = shm::negotiateReadPeer(fa.get(), true, Deadline::after(10));
  fake.join();
  ASSERT_TRUE(verdict.isOk()) << verdict.status().message();
  EXPECT_EQ(verdict->peerPid, 0);
  EXPECT_NE(verdict->refused.find("process_vm_readv"), std::string::npos) << verdict->refused;
}

std::unique_ptr<StreamConnection> connectShm(shm::Segment segment, bool creator, int fd, int peer,
                                             pid_t peerPid) {
  auto stream =
      std::make_unique<shm::ShmStream>(std::move(segment), kRingBytes, creator, tcp::Fd(fd), peer);
  if (peerPid > 0) stream->enableReadPeer(peerPid);
  return std::make_unique<StreamConnection>(std::move(stream), peer, patient());
}

// Two processes that probe each other, then exchange large messages both
// ways, one of them reduced, each copied once from the other's memory.
TEST_F(SingleCopy, CopiesAcrossProcesses) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  auto created = shm::Segment::create(shm::segmentBytes(kRingBytes));
  ASSERT_TRUE(created.isOk());
  shm::ShmStream::initialize(*created, kRingBytes);
  const std::string name = created->name();
  const size_t bytes = (16 << 20) + 4;
  pid_t child = fork();
  if (child == 0) {
    ::close(fds[0]);
    auto opened = shm::Segment::open(name, shm::segmentBytes(kRingBytes));
    if (!opened.isOk()) _exit(10);
    auto verdict = shm::negotiateReadPeer(fds[1], true, Deadline::after(10));
    if (!verdict.isOk()) _exit(11);
    if (verdict->peerPid == 0) _exit(77);  // not permitted here
    if (verdict->peerPid != ::getppid()) _exit(12);
    auto b = connectShm(std::move(*opened), false, fds[1], 0, verdict->peerPid);
    std::vector<uint8_t> got(bytes), local = pattern(bytes, 21), sum(bytes);
    std::vector<uint8_t> reply = pattern(bytes, 22);
    Adder adder;
    adder.unit = 4;
    adder.dst = sum.data();
    std::vector<RequestPtr> requests = {
        b->postRecv(got.data(), bytes, tag(1)),
        b->postRecvReduce(sum.data(), local.data(), bytes, tag(2), {4, &Adder::apply, &adder}),
        b->postSend(reply.data(), bytes, tag(1))};
    if (!runUntilDone(*b, requests)) _exit(13);
    for (const auto& r : requests)
      if (r->state() != Request::State::kDone) _exit(14);
    if (got != pattern(bytes, 20)) _exit(15);
    std::vector<uint8_t> incoming = pattern(bytes, 23);
    for (size_t i = 0; i < bytes; ++i)
      if (sum[i] != static_cast<uint8_t>(local[i] + incoming[i])) _exit(16);
    _exit(0);
  }
  ASSERT_GT(child, 0);
  ::close(fds[1]);
  auto verdict = shm::negotiateReadPeer(fds[0], true, Deadline::after(10));
  created->unlink();
  ASSERT_TRUE(verdict.isOk()) << verdict.status().message();
  if (verdict->peerPid == 0) {
    int status = 0;
    waitpid(child, &status, 0);
    GTEST_SKIP() << "the processes may not read each other: " << verdict->refused;
  }
  EXPECT_EQ(verdict->peerPid, child);
  auto a = connectShm(std::move(*created), true, fds[0], 1, verdict->peerPid);
  std::vector<uint8_t> out = pattern(bytes, 20), reduced = pattern(bytes, 23), back(bytes);
  std::vector<RequestPtr> requests = {a->postSend(out.data(), bytes, tag(1)),
                                      a->postSend(reduced.data(), bytes, tag(2)),
                                      a->postRecv(back.data(), bytes, tag(1))};
  EXPECT_TRUE(runUntilDone(*a, requests));
  for (const auto& r : requests) EXPECT_EQ(r->state(), Request::State::kDone);
  EXPECT_EQ(back, pattern(bytes, 22));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's checks (see its exit codes)";
}

// A receiver that dies holding a descriptor fails the send waiting for its ack.
TEST_F(SingleCopy, KilledReceiverFailsASendWaitingForItsAck) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  auto created = shm::Segment::create(shm::segmentBytes(kRingBytes));
  ASSERT_TRUE(created.isOk());
  shm::ShmStream::initialize(*created, kRingBytes);
  const std::string name = created->name();
  pid_t child = fork();
  if (child == 0) {
    ::close(fds[0]);
    auto opened = shm::Segment::open(name, shm::segmentBytes(kRingBytes));
    if (!opened.isOk()) _exit(10);
    auto b = connectShm(std::move(*opened), false, fds[1], 0, ::getppid());
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!b->unclaimed(0, 2) && std::chrono::steady_clock::now() < until) (void)b->progress();
    _exit(b->unclaimed(0, 2) ? 0 : 11);  // dies holding the descriptor, saying nothing
  }
  ASSERT_GT(child, 0);
  ::close(fds[1]);
  auto a = connectShm(std::move(*created), true, fds[0], 1, child);
  std::vector<uint8_t> big = pattern(1 << 20, 30);
  RequestPtr s = a->postSend(big.data(), big.size(), tag(1));
  EXPECT_TRUE(runUntilDone(*a, {s}));
  ASSERT_EQ(s->state(), Request::State::kFailed);
  EXPECT_EQ(s->error().code(), ErrorCode::kRemoteError);
  EXPECT_NE(s->error().message().find("rank 1"), std::string::npos) << s->error().message();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child saw the descriptor before it died";
}

// A sender that died after its descriptor went out fails the receive.
TEST_F(SingleCopy, KilledSenderFailsTheReceiveBeingCopied) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
  auto created = shm::Segment::create(shm::segmentBytes(kRingBytes));
  ASSERT_TRUE(created.isOk());
  shm::ShmStream::initialize(*created, kRingBytes);
  const std::string name = created->name();
  pid_t child = fork();
  if (child == 0) {
    ::close(fds[0]);
    auto opened = shm::Segment::open(name, shm::segmentBytes(kRingBytes));
    if (!opened.isOk()) _exit(10);
    auto b = connectShm(std::move(*opened), false, fds[1], 0, ::getppid());
    std::vector<uint8_t> big = pattern(64 << 20, 31);
    RequestPtr s = b->postSend(big.data(), big.size(), tag(1));
    for (int i = 0; i < 20; ++i) (void)b->progress();  // the descriptor is out
    _exit(s->state() == Request::State::kPending ? 0 : 11);
  }
  ASSERT_GT(child, 0);
  ::close(fds[1]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's descriptor went out";
  auto a = connectShm(std::move(*created), true, fds[0], 1, child);
  std::vector<uint8_t> got(64 << 20);
  RequestPtr r = a->postRecv(got.data(), got.size(), tag(1));
  EXPECT_TRUE(runUntilDone(*a, {r}));
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kRemoteError);
  EXPECT_NE(r->error().message().find("rank 1"), std::string::npos) << r->error().message();
}

}  // namespace
}  // namespace braid::transport

namespace braid::transport {
namespace {

// A peer that sends what a test scripts, and whose memory (for descriptors)
// is `memory` of this process.
class ScriptedPeer final : public ByteStream {
 public:
  // Without `memory` the peer closes after its bytes; with it, it stays.
  explicit ScriptedPeer(std::vector<uint8_t> bytes, std::vector<uint8_t>* memory = nullptr)
      : bytes_(std::move(bytes)), memory_(memory) {}
  Result<size_t> writeSome(const iovec* iov, int count) override {
    size_t n = 0;
    for (int i = 0; i < count; ++i) n += iov[i].iov_len;
    return n;
  }
  Result<size_t> readSome(void* into, size_t room) override {
    if (at_ == bytes_.size()) {
      if (memory_) return size_t{0};
      return remoteError("the peer closed the connection");
    }
    const size_t n = std::min(room, bytes_.size() - at_);
    std::memcpy(into, bytes_.data() + at_, n);
    at_ += n;
    return n;
  }
  void writeLast(const iovec*, int) override {}
  void close() override {}
  int pollFd() const override { return -1; }
  bool pollForWrite(bool) const override { return false; }
  bool canReadPeer() const override { return memory_ != nullptr; }
  Status readPeer(void* into, uint64_t address, uint64_t, size_t bytes) override {
    const auto base = reinterpret_cast<uintptr_t>(memory_->data());
    if (address < base || address - base > memory_->size() ||
        bytes > memory_->size() - (address - base))
      return errnoStatus("process_vm_readv", EFAULT);
    std::memcpy(into, memory_->data() + (address - base), bytes);
    return Status::ok();
  }

 private:
  std::vector<uint8_t> bytes_;
  size_t at_ = 0;
  std::vector<uint8_t>* memory_;
};

std::vector<uint8_t> header(uint64_t tag, uint64_t check, uint64_t bytes, uint64_t remote) {
  const StreamConnection::FrameHeader h{tag, check, bytes, remote, 0};
  std::vector<uint8_t> out(sizeof h);
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

// A corrupt or hostile peer may claim any size in a frame header. The
// receiver holds only what actually arrives: here 100 bytes of a frame
// claiming 2^62, then the end of the stream, which fails the connection
// cleanly instead of an allocation of the claimed size failing (or worse,
// succeeding).
TEST(HostilePeer, FrameClaimingAnyLengthCostsOnlyWhatArrives) {
  std::vector<uint8_t> bytes = header(5, 7, uint64_t{1} << 62, 0);
  bytes.resize(bytes.size() + 100, 'x');
  StreamConnection c(std::make_unique<ScriptedPeer>(std::move(bytes)), 1);
  Result<bool> moved = c.progress();
  ASSERT_FALSE(moved.isOk());
  EXPECT_EQ(moved.status().code(), ErrorCode::kRemoteError) << moved.status().message();
}

// A descriptor names the sender's memory; one that claims more than the
// sender has fails when copied, before the receiver allocates room for it.
TEST(HostilePeer, DescriptorClaimingMoreThanThePeerHasFailsTheConnection) {
  std::vector<uint8_t> memory(4096, 1);
  const auto remote = reinterpret_cast<uintptr_t>(memory.data());
  StreamConnection::Options copyAtOnce;
  copyAtOnce.unclaimedDescriptorWait = std::chrono::microseconds(0);
  for (uint64_t claimed : {uint64_t{1} << 62, uint64_t{1} << 33, ~uint64_t{0} - remote + 2}) {
    StreamConnection c(std::make_unique<ScriptedPeer>(header(5, 7, claimed, remote), &memory), 1,
                       copyAtOnce);
    Result<bool> moved = c.progress();       // the descriptor arrives
    if (moved.isOk()) moved = c.progress();  // and goes unclaimed
    ASSERT_FALSE(moved.isOk()) << claimed;
    EXPECT_NE(moved.status().code(), ErrorCode::kOk);
    EXPECT_FALSE(moved.status().message().empty());
  }
}

}  // namespace
}  // namespace braid::transport
