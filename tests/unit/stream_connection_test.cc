// The connection contract over each byte stream, and the shm stream's sleeps and segments.
#include "transports/stream_connection.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/stream_connection_fixtures.h"
#include "transports/completion_signal.h"
#include "transports/shm/shm_stream.h"
#include "transports/tcp/socket_stream.h"

namespace braid::transport {
namespace {

// The contract: tagged matching in any order, direct and staged payloads,
// mismatch detection, and failure when the peer goes away. Every test runs
// over a socket pair, over shared-memory rings, and over rings whose large
// messages are copied once from the sender's memory (shm_cma; in one process
// the peer's memory is our own).
class Connection : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "shm_cma" && !selfReadable())
      GTEST_SKIP() << "process_vm_readv is not permitted here";
  }
};

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
    // Copied once, from the sender's memory: the head by the receiver, the
    // tail by the sender.
    EXPECT_EQ(p.bs->bytesRead + p.as->bytesWritten, big.size());
    EXPECT_EQ(p.as->bytesRead + p.bs->bytesWritten, back.size());
    EXPECT_GT(p.as->bytesWritten, 0u);
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

// A receive posted while its message is arriving takes what has come at
// once and the rest where it belongs as it comes, rather than all of it at
// the end from memory of the connection's own (a second copy of the whole
// message). Shown by the receive buffer holding the first bytes, combined
// for a reduction, before the message is complete.
TEST_P(Connection, ReceivePostedWhileItsMessageArrivesTakesItAtOnce) {
  StreamConnection::Options streamed;
  streamed.readPeerBytes = SIZE_MAX;  // shm_cma too sends the payload through the stream
  for (bool reduces : {false, true}) {
    SCOPED_TRACE(reduces ? "receive with reduction" : "plain receive");
    Pair p(GetParam(), streamed);
    std::vector<int32_t> out(4 << 20), local(out.size()), got(out.size(), -1);
    std::iota(out.begin(), out.end(), 0);
    std::iota(local.begin(), local.end(), 5);
    const size_t bytes = 4 * out.size();
    RequestPtr s = p.a->postSend(out.data(), bytes, tag(1));
    // Part of the payload arrives with no receive posted (the rest does not
    // fit the rings or the socket's buffers until b reads more).
    for (int i = 0; i < 4; ++i) {
      (void)p.a->progress();
      (void)p.b->progress();
    }
    ASSERT_EQ(s->state(), Request::State::kPending) << "the whole message arrived: make it larger";
    RequestPtr r = reduces ? p.b->postRecvReduce(got.data(), local.data(), bytes, tag(1),
                                                 {4, &addInt32Checked, nullptr})
                           : p.b->postRecv(got.data(), bytes, tag(1));
    ASSERT_EQ(r->state(), Request::State::kPending);
    EXPECT_EQ(got[0], reduces ? out[0] + local[0] : out[0]) << "nothing taken when posted";
    p.drive({s, r});
    ASSERT_EQ(r->state(), Request::State::kDone);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], reduces ? out[i] + local[i] : out[i]) << "at element " << i;
  }
}

// A caller that shares the connection with other threads' calls tells its
// own progress from theirs by its requests' marks: a message that takes many
// passes marks its send and its receive before they end, and marks no
// receive of another message. A send queued behind one whose bytes move is
// marked too: it goes as soon as that one has, whatever the peer does.
TEST_P(Connection, BytesOfAMessageMarkItsRequestsBeforeTheyEnd) {
  Pair p(GetParam());
  EXPECT_TRUE(p.a->reportsPartialProgress());
  std::vector<uint8_t> out(8 << 20, 3), got(out.size()), other(64);
  std::vector<uint8_t> small(64, 5), gotSmall(64);
  RequestPtr s = p.a->postSend(out.data(), out.size(), tag(1));
  RequestPtr behind = p.a->postSend(small.data(), small.size(), tag(3));
  RequestPtr r = p.b->postRecv(got.data(), got.size(), tag(1));
  RequestPtr unrelated = p.b->postRecv(other.data(), other.size(), tag(4));
  bool sendMarked = false, recvMarked = false, behindMarked = false;
  for (int pass = 0; pass < 100000 && r->state() == Request::State::kPending; ++pass) {
    (void)p.a->progress();
    (void)p.b->progress();
    sendMarked = sendMarked || (s->state() == Request::State::kPending && s->progressMarks() > 0);
    recvMarked = recvMarked || (r->state() == Request::State::kPending && r->progressMarks() > 0);
    behindMarked =
        behindMarked || (behind->state() == Request::State::kPending &&
                         s->state() == Request::State::kPending && behind->progressMarks() > 0);
  }
  RequestPtr takeSmall = p.b->postRecv(gotSmall.data(), gotSmall.size(), tag(3));
  p.drive({s, r, behind, takeSmall});
  EXPECT_TRUE(sendMarked) << "the send's bytes moved over many passes, unmarked";
  EXPECT_TRUE(recvMarked) << "the receive's bytes arrived over many passes, unmarked";
  // Copied once (shm_cma), the large message is a descriptor: nothing waits
  // behind its bytes on the stream.
  if (GetParam() != "shm_cma")
    EXPECT_TRUE(behindMarked) << "a send queued behind a moving one, unmarked";
  EXPECT_EQ(unrelated->progressMarks(), 0u);
  EXPECT_EQ(unrelated->state(), Request::State::kPending);
}

// The read that completes the last receive posted stops there, when this
// end waits for nothing else on the connection: the next message stays in
// the stream until its receive is posted, and then goes straight where it
// belongs. Read on, it arrived unmatched and was copied a second time (in a
// loop of large Send/Recv, whole messages of the next call did).
TEST_P(Connection, TheNextMessageWaitsInTheStreamOnceTheLastReceiveIsDone) {
  StreamConnection::Options streamed;
  streamed.readPeerBytes = SIZE_MAX;      // shm_cma too sends the payload through the stream
  Pair p(GetParam(), streamed, 1 << 20);  // rings that hold both messages
  std::vector<uint8_t> first(64 << 10), second(64 << 10), got(first.size()), got2(second.size());
  std::iota(first.begin(), first.end(), 1);
  std::iota(second.begin(), second.end(), 3);
  RequestPtr s1 = p.a->postSend(first.data(), first.size(), tag(1));
  RequestPtr s2 = p.a->postSend(second.data(), second.size(), tag(2));
  for (int i = 0; i < 1000 && s2->state() == Request::State::kPending; ++i) (void)p.a->progress();
  ASSERT_EQ(s2->state(), Request::State::kDone) << "both messages fit in the stream";
  RequestPtr r1 = p.b->postRecv(got.data(), got.size(), tag(1));
  p.drive({r1});
  ASSERT_EQ(r1->state(), Request::State::kDone);
  EXPECT_FALSE(p.b->mayHaveUnclaimed() && p.b->unclaimed(tag(2).channel(), UINT64_MAX))
      << "the second message was read with no receive posted";
  RequestPtr r2 = p.b->postRecv(got2.data(), got2.size(), tag(2));
  EXPECT_EQ(r2->state(), Request::State::kPending) << "delivered from a copy of its own";
  p.drive({r2});
  ASSERT_EQ(r2->state(), Request::State::kDone);
  EXPECT_TRUE(got == first);
  EXPECT_TRUE(got2 == second);
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

// The rings of a host's pairs take at most half of /dev/shm's room, and as
// much of it as a power of two allows, up to the preferred size.
TEST(ShmRings, FittedToHalfTheRoomOfDevShm) {
  constexpr size_t kMiB = size_t{1} << 20;
  EXPECT_EQ(shm::fittedRingBytes(kMiB, 12 * 1024 * kMiB, 8), kMiB);  // room to spare
  EXPECT_EQ(shm::fittedRingBytes(kMiB, 0, 1), kMiB);                 // no pair
  for (int ranks : {2, 6, 8, 16, 64, 256}) {
    for (size_t room : {24 * kMiB, 64 * kMiB, 1024 * kMiB}) {
      SCOPED_TRACE(testing::Message() << ranks << " ranks, " << (room >> 20) << " MiB");
      const size_t pairs = static_cast<size_t>(ranks) * (ranks - 1) / 2;
      const size_t ring = shm::fittedRingBytes(kMiB, room, ranks);
      EXPECT_EQ(ring & (ring - 1), 0u);
      EXPECT_GE(ring, shm::kMinRingBytes);
      EXPECT_LE(ring, kMiB);
      if (ring > shm::kMinRingBytes) {
        EXPECT_LE(pairs * shm::segmentBytes(ring), room / 2);
      }
      if (ring < kMiB) {
        EXPECT_GT(pairs * shm::segmentBytes(2 * ring), room / 2);
      }
    }
  }
  // Docker's default /dev/shm (64 MiB) and 8 ranks: 28 pairs in 32 MiB.
  EXPECT_EQ(shm::fittedRingBytes(kMiB, 64 * kMiB, 8), kMiB / 2);
  // Nothing fits: the smallest ring, and the pairs beyond the room fall back to TCP.
  EXPECT_EQ(shm::fittedRingBytes(kMiB, kMiB, 256), shm::kMinRingBytes);
}

// Two threads on one shared-memory connection (two braid streams): one gets
// ready to sleep, so the peer's next message rings the bell for it, and the
// other reads that message, draining the bell. The sleeper's poll no longer
// sees the bell, so the reader must wake the process's sleepers instead.
TEST(ShmDoorbell, ABellDrainedForAnotherThreadWakesTheSleepers) {
  Pair p("shm");
  CompletionSignal::beginSleep();  // leaves the signal unrung: the last sleeper drains it
  CompletionSignal::endSleep();
  int32_t x = 5, y = 0;
  auto received = p.b->postRecv(&y, sizeof(y), Tag{1, 1});
  std::thread([&] { EXPECT_TRUE(p.b->prepareToSleep()); }).join();
  CompletionSignal::beginSleep();  // the thread above, asleep in the engine
  auto sent = p.a->postSend(&x, sizeof(x), Tag{1, 1});
  for (int i = 0; i < 100 && received->state() == Request::State::kPending; ++i) {
    ASSERT_TRUE(p.a->progress().isOk());
    ASSERT_TRUE(p.b->progress().isOk());
  }
  ASSERT_EQ(received->state(), Request::State::kDone);
  EXPECT_EQ(y, 5);
  pollfd signal{CompletionSignal::fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&signal, 1, 0), 1) << "the sleeper was not woken";
  CompletionSignal::endSleep();
}

}  // namespace
}  // namespace braid::transport
