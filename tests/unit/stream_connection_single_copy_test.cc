// The single-copy protocol in one process: descriptors, acks, reductions, copies, sleeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "src/common/strcat.h"
#include "tests/unit/stream_connection_fixtures.h"
#include "transports/shm/host_allocations.h"
#include "transports/stream_connection.h"

namespace braid::transport {
namespace {

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
  EXPECT_EQ(p.bs->bytesRead + p.as->bytesWritten, big.size()) << "each byte copied once";
  EXPECT_GE(p.bs->reads + p.as->writes, 3u) << "at most 1 MiB per progress() call";
  EXPECT_FALSE(p.b->unclaimed(0, 2).has_value());
}

// Pushes: the sender of a large descriptor copies its tail into the
// receive buffer while the receiver copies the head.

TEST_F(SingleCopy, SenderWritesTheTailWhileTheReceiverReadsTheHead) {
  for (bool postedFirst : {true, false}) {
    SCOPED_TRACE(postedFirst ? "posted first" : "posted late");
    Pair p("shm_cma", patient());
    const size_t bytes = (3 << 20) + 5;  // no multiple of a page
    std::vector<uint8_t> big = pattern(bytes, 11), got(bytes);
    RequestPtr r, s;
    if (postedFirst) r = p.b->postRecv(got.data(), bytes, tag(1));
    s = p.a->postSend(big.data(), bytes, tag(1));
    if (!postedFirst) {
      for (int i = 0; i < 20; ++i) {
        (void)p.a->progress();
        (void)p.b->progress();
      }
      r = p.b->postRecv(got.data(), bytes, tag(1));
    }
    p.drive({s, r});
    ASSERT_EQ(r->state(), Request::State::kDone);
    ASSERT_EQ(s->state(), Request::State::kDone);
    EXPECT_EQ(got, big);
    const size_t head = bytes / 2 / 4096 * 4096;
    EXPECT_EQ(p.bs->bytesRead, head) << "the receiver reads the head, split on a page";
    EXPECT_EQ(p.as->bytesWritten, bytes - head) << "the sender writes the rest";
    EXPECT_GE(p.as->writes, 2u) << "at most 1 MiB per progress() call";
  }
}

TEST_F(SingleCopy, ManyPushesInFlightBothWays) {
  Pair p("shm_cma", patient());
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<RequestPtr> requests;
  for (int i = 0; i < 3; ++i) {
    const size_t bytes = (size_t{2} << 20) + 4096 * i + i;
    out.push_back(pattern(bytes, 30 + i));
    out.push_back(pattern(bytes, 40 + i));
    in.emplace_back(bytes);
    in.emplace_back(bytes);
  }
  for (size_t i = 0; i < out.size(); i += 2) {
    requests.push_back(p.b->postRecv(in[i].data(), in[i].size(), tag(i + 1)));
    requests.push_back(p.a->postSend(out[i].data(), out[i].size(), tag(i + 1)));
    requests.push_back(p.b->postSend(out[i + 1].data(), out[i + 1].size(), tag(i + 1)));
    requests.push_back(p.a->postRecv(in[i + 1].data(), in[i + 1].size(), tag(i + 1)));
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  auto pending = [&] {
    for (const auto& r : requests)
      if (r->state() == Request::State::kPending) return true;
    return false;
  };
  while (pending() && std::chrono::steady_clock::now() < until) {
    (void)p.a->progress();
    (void)p.b->progress();
  }
  for (const auto& r : requests) EXPECT_EQ(r->state(), Request::State::kDone);
  EXPECT_EQ(in, out);
  EXPECT_GT(p.as->bytesWritten, 0u);
  EXPECT_GT(p.bs->bytesWritten, 0u);
}

TEST_F(SingleCopy, SenderThatCannotWriteLeavesTheCopyToTheReceiver) {
  Pair p("shm_cma", patient());
  p.as->failWrites = true;  // as under a seccomp profile that forbids process_vm_writev
  const size_t bytes = 2 << 20;
  for (uint8_t round : {1, 2}) {
    SCOPED_TRACE(strCat("message ", int{round}));
    std::vector<uint8_t> big = pattern(bytes, 50 + round), got(bytes);
    const size_t readBefore = p.bs->bytesRead;
    RequestPtr r = p.b->postRecv(got.data(), bytes, tag(round));
    RequestPtr s = p.a->postSend(big.data(), bytes, tag(round));
    p.drive({s, r});
    ASSERT_EQ(r->state(), Request::State::kDone);
    ASSERT_EQ(s->state(), Request::State::kDone);
    EXPECT_EQ(got, big);
    EXPECT_EQ(p.bs->bytesRead - readBefore, bytes) << "the receiver copies it all";
  }
  EXPECT_EQ(p.as->bytesWritten, 0u);
}

TEST_F(SingleCopy, NoPushForReductionsSmallMessagesOrStreamsThatCannotWrite) {
  const size_t bytes = 2 << 20;
  std::vector<uint8_t> big = pattern(bytes, 60), got(bytes);
  {
    SCOPED_TRACE("a stream that cannot write");
    Pair p("shm_cma", patient());
    p.as->refuseWrites = p.bs->refuseWrites = true;
    RequestPtr r = p.b->postRecv(got.data(), bytes, tag(1));
    RequestPtr s = p.a->postSend(big.data(), bytes, tag(1));
    p.drive({s, r});
    EXPECT_EQ(got, big);
    EXPECT_EQ(p.bs->bytesRead, bytes);
    EXPECT_EQ(p.as->bytesWritten, 0u);
  }
  {
    SCOPED_TRACE("below pushBytes");
    StreamConnection::Options options = patient();
    options.pushBytes = bytes + 1;
    Pair p("shm_cma", options);
    RequestPtr r = p.b->postRecv(got.data(), bytes, tag(1));
    RequestPtr s = p.a->postSend(big.data(), bytes, tag(1));
    p.drive({s, r});
    EXPECT_EQ(p.bs->bytesRead, bytes);
    EXPECT_EQ(p.as->bytesWritten, 0u);
  }
  {
    SCOPED_TRACE("a reduction");
    Pair p("shm_cma", patient());
    std::vector<uint8_t> local(bytes, 1);
    Adder adder;
    adder.dst = got.data();
    RequestPtr r =
        p.b->postRecvReduce(got.data(), local.data(), bytes, tag(1), {1, &Adder::apply, &adder});
    RequestPtr s = p.a->postSend(big.data(), bytes, tag(1));
    p.drive({s, r});
    EXPECT_EQ(r->state(), Request::State::kDone);
    EXPECT_EQ(p.bs->bytesRead, bytes);
    EXPECT_EQ(p.as->bytesWritten, 0u);
  }
}

// A receiver that gives up says so before the sender's next write: its
// buffer, which its caller has back, is not written any more.
TEST_F(SingleCopy, ReceiverThatAbortsIsNotWrittenAfterItsGoodbye) {
  Pair p("shm_cma", patient());
  const size_t bytes = 8 << 20, piece = 1 << 20;
  std::vector<uint8_t> big = pattern(bytes, 70), got(bytes, 0);
  RequestPtr r = p.b->postRecv(got.data(), bytes, tag(1));
  RequestPtr s = p.a->postSend(big.data(), bytes, tag(1));
  (void)p.a->progress();  // the descriptor goes out
  // The descriptor arrives, then the push is asked for and a first piece read.
  for (int i = 0; i < 100 && p.bs->bytesRead == 0; ++i) (void)p.b->progress();
  ASSERT_EQ(p.bs->bytesRead, piece);
  (void)p.a->progress();  // the push arrives and a first piece is written
  ASSERT_EQ(p.as->bytesWritten, piece);
  p.b->abort(invalidUsage("rank 0 gave up"));
  ASSERT_EQ(r->state(), Request::State::kFailed);
  p.drive({s});
  EXPECT_EQ(s->state(), Request::State::kFailed);
  EXPECT_EQ(p.as->bytesWritten, piece) << "nothing written after the goodbye";
  const size_t head = bytes / 2;
  EXPECT_TRUE(std::all_of(got.begin() + head + piece, got.end(), [](uint8_t b) { return b == 0; }));
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

// A buffer of braidHostAlloc (shm::allocateShared), freed at scope's end.
struct SharedBuffer {
  explicit SharedBuffer(size_t bytes) : data(static_cast<uint8_t*>(*shm::allocateShared(bytes))) {}
  ~SharedBuffer() { (void)shm::freeShared(data); }
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  uint8_t* data;
};

// Payloads in braidHostAlloc memory: the receiver reads them through a
// mapping, so it asks the sender to write half only when that half goes
// into braidHostAlloc memory too (a mapping again), never with
// process_vm_writev, which is slower than reading it all.
TEST_F(SingleCopy, SharedAllocationsArePushedOnlyIntoSharedAllocations) {
  const size_t bytes = (3 << 20) + 5;
  const size_t head = bytes / 2 / 4096 * 4096;
  const std::vector<uint8_t> big = pattern(bytes, 71);
  for (bool sourceShared : {true, false})
    for (bool targetShared : {true, false}) {
      SCOPED_TRACE(strCat(sourceShared ? "from shared" : "from malloc",
                          targetShared ? " into shared" : " into malloc"));
      Pair p("shm_cma", patient());
      SharedBuffer sharedSource(bytes), sharedTarget(bytes);
      std::vector<uint8_t> plainSource = big, plainTarget(bytes);
      uint8_t* source = sourceShared ? sharedSource.data : plainSource.data();
      uint8_t* target = targetShared ? sharedTarget.data : plainTarget.data();
      std::copy(big.begin(), big.end(), source);
      RequestPtr r = p.b->postRecv(target, bytes, tag(1));
      RequestPtr s = p.a->postSend(source, bytes, tag(1));
      p.drive({s, r});
      ASSERT_EQ(r->state(), Request::State::kDone);
      ASSERT_EQ(s->state(), Request::State::kDone);
      EXPECT_TRUE(std::equal(big.begin(), big.end(), target));
      const bool pushed = !sourceShared || targetShared;
      EXPECT_EQ(p.bs->bytesRead, pushed ? head : bytes);
      EXPECT_EQ(p.as->bytesWritten, pushed ? bytes - head : 0);
    }
}

// A receive with reduction combines straight from the sender's mapped
// allocation: nothing is copied through the staging buffer first.
TEST_F(SingleCopy, ReductionReadsASharedAllocationInPlace) {
  const size_t unit = 4, bytes = unit * 600011;
  Pair p("shm_cma", patient());
  SharedBuffer incoming(bytes);
  const std::vector<uint8_t> in = pattern(bytes, 5), local = pattern(bytes, 6);
  std::copy(in.begin(), in.end(), incoming.data);
  std::vector<uint8_t> out(bytes);
  Adder adder;
  adder.unit = unit;
  adder.dst = out.data();
  RequestPtr r =
      p.b->postRecvReduce(out.data(), local.data(), bytes, tag(1), {unit, &Adder::apply, &adder});
  RequestPtr s = p.a->postSend(incoming.data, bytes, tag(1));
  p.drive({s, r});
  ASSERT_EQ(r->state(), Request::State::kDone);
  EXPECT_EQ(s->state(), Request::State::kDone);
  for (size_t i = 0; i < bytes; ++i)
    if (out[i] != static_cast<uint8_t>(local[i] + in[i])) {
      ADD_FAILURE() << "byte " << i;
      break;
    }
  EXPECT_EQ(adder.units, bytes / unit);
  EXPECT_FALSE(adder.split);
  EXPECT_EQ(p.bs->bytesReadInPlace, bytes);
  EXPECT_EQ(p.bs->bytesRead, 0u) << "no copy through the staging buffer";
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

}  // namespace
}  // namespace braid::transport
