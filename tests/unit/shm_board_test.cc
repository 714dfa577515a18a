// The shared-memory board on its own: what a reader sees of a slot, the
// two slots per rank, lanes of slots and announcements per stream, the
// counts of point-to-point calls per pair, and a sleeping reader woken by
// the publisher (threads of one process map the board twice, as ranks
// would).
#include "transports/shm/shm_board.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace braid::shm {
namespace {

struct TwoMappings {
  Board creator, opener;
};

TwoMappings mapTwice(int nranks, int streams = 3, size_t payloadBytes = 48, int lanes = 2) {
  auto created = Board::create(nranks, streams, lanes, payloadBytes);
  EXPECT_TRUE(created.isOk()) << created.status().message();
  auto opened = Board::open(created->name(), nranks, streams, lanes, payloadBytes);
  EXPECT_TRUE(opened.isOk()) << opened.status().message();
  TwoMappings m{std::move(*created), std::move(*opened)};
  m.creator.unlink();
  return m;
}

TEST(ShmBoard, ASlotShowsOnceItsSequenceIsPublished) {
  TwoMappings m = mapTwice(3);
  EXPECT_EQ(m.opener.published(0, 2, 1), nullptr);
  const double value = 2.5;
  m.creator.publish(0, 2, 1, 0xabc, &value, sizeof value);
  const BoardSlot* slot = m.opener.published(0, 2, 1);
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(slot->check, 0xabcu);
  double seen = 0;
  std::memcpy(&seen, slot->payload(), sizeof seen);
  EXPECT_EQ(seen, 2.5);
  // Another rank's slots and the next call's are untouched.
  EXPECT_EQ(m.opener.published(0, 1, 1), nullptr);
  EXPECT_EQ(m.opener.published(0, 2, 2), nullptr);
}

TEST(ShmBoard, CallsAlternateBetweenTwoSlotsPerRank) {
  TwoMappings m = mapTwice(2);
  const int32_t a = 1, b = 2, c = 3;
  m.creator.publish(0, 0, 1, 1, &a, sizeof a);
  m.creator.publish(0, 0, 2, 2, &b, sizeof b);
  // Call 2 left call 1's slot alone; call 3 takes it over.
  ASSERT_NE(m.opener.published(0, 0, 1), nullptr);
  ASSERT_NE(m.opener.published(0, 0, 2), nullptr);
  m.creator.publish(0, 0, 3, 3, &c, sizeof c);
  EXPECT_EQ(m.opener.published(0, 0, 1), nullptr);
  ASSERT_NE(m.opener.published(0, 0, 3), nullptr);
  EXPECT_EQ(m.opener.published(0, 0, 3)->check, 3u);
  EXPECT_EQ(m.opener.published(0, 0, 2)->check, 2u);
}

TEST(ShmBoard, AnnouncementsCarryTheLatestCall) {
  TwoMappings m = mapTwice(2);
  EXPECT_FALSE(m.opener.announced(1, 0).made);  // nothing called yet
  m.creator.announce(1, 0, 0, 77);
  EXPECT_TRUE(m.opener.announced(1, 0).of(0));
  m.creator.announce(1, 0, 5, 99);
  const Announcement seen = m.opener.announced(1, 0);
  EXPECT_TRUE(seen.of(5));
  EXPECT_EQ(seen.check, 99u);
  EXPECT_FALSE(m.opener.announced(0, 0).made);
}

// Call indices wrap after 2^32 calls: index 2^32 - 1 is a call like any
// other, and the call after it is later.
TEST(ShmBoard, AnnouncementsOrderCallsAcrossTheWrap) {
  TwoMappings m = mapTwice(2);
  m.creator.announce(1, 0, 0xffffffff, 7);
  const Announcement last = m.opener.announced(1, 0);
  EXPECT_TRUE(last.of(0xffffffff));
  EXPECT_TRUE(last.before(0));
  EXPECT_FALSE(last.before(0xffffffff));
  EXPECT_FALSE(last.before(0xfffffffe));
  m.creator.announce(0, 0, 0, 8);
  const Announcement next = m.opener.announced(0, 0);
  EXPECT_TRUE(next.laterThan(last));
  EXPECT_FALSE(last.laterThan(next));
  EXPECT_TRUE(last.laterThan(Announcement{}));
  EXPECT_FALSE(Announcement{}.laterThan(last));
}

// Each stream's calls are counted on their own: a rank's latest call on one
// stream says nothing of its calls on another.
TEST(ShmBoard, EachStreamHasItsOwnAnnouncements) {
  TwoMappings m = mapTwice(3, 4);
  m.creator.announce(2, 3, 7, 70);  // the last rank's last stream: inside the mapping
  m.creator.announce(2, 0, 1, 10);
  m.creator.announce(1, 3, 4, 40);
  EXPECT_TRUE(m.opener.announced(2, 3).of(7));
  EXPECT_EQ(m.opener.announced(2, 3).check, 70u);
  EXPECT_TRUE(m.opener.announced(2, 0).of(1));
  EXPECT_EQ(m.opener.announced(2, 0).check, 10u);
  EXPECT_TRUE(m.opener.announced(1, 3).of(4));
  for (int stream : {1, 2}) EXPECT_FALSE(m.opener.announced(2, stream).made);
  EXPECT_FALSE(m.opener.announced(1, 0).made);
  EXPECT_FALSE(m.opener.announced(0, 3).made);
  // Slots and announcements do not overlap.
  EXPECT_EQ(m.opener.published(0, 2, 1), nullptr);
  EXPECT_EQ(m.opener.published(0, 2, 2), nullptr);
}

// A rank killed between the two halves of its announcement (its version
// left odd for good) must not hold its peers in the read forever: they ask
// on every pass of every call's wait, where the timeout, an abort and the
// dead peer's closed sockets are all looked at. After a while the reader
// takes it as no announcement at all, which is no evidence of anything.
TEST(ShmBoard, AnAnnouncementLeftHalfWrittenIsReadAsNone) {
  constexpr int kRanks = 2, kStreams = 3, kLanes = 2;
  auto created = Board::create(kRanks, kStreams, kLanes, 48);
  ASSERT_TRUE(created.isOk()) << created.status().message();
  auto opened = Board::open(created->name(), kRanks, kStreams, kLanes, 48);
  ASSERT_TRUE(opened.isOk()) << opened.status().message();
  // The dead writer's view: the segment mapped again by name.
  const int fd = shm_open(created->name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  void* base =
      mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(base, MAP_FAILED);
  created->unlink();
  const size_t slotBytes = opened->payloadBytes() + BoardSlot::kHeaderBytes;
  auto* lines = reinterpret_cast<Board::AnnouncementLine*>(static_cast<uint8_t*>(base) +
                                                           2 * kLanes * kRanks * slotBytes);
  created->announce(1, 2, 4, 44);
  ASSERT_TRUE(opened->announced(1, 2).of(4));    // the line computed is the one read
  lines[1 * kStreams + 2].version.fetch_add(1);  // the first half of a next announcement
  const auto start = std::chrono::steady_clock::now();
  std::atomic<bool> returned{false};
  Announcement seen{true, 1, 1};
  std::thread reader([&] {
    seen = opened->announced(1, 2);
    returned = true;
  });
  while (!returned && std::chrono::steady_clock::now() - start < std::chrono::seconds(3))
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!returned) {
    ADD_FAILURE() << "the read of a half-written announcement did not return in 3 s";
    std::_Exit(1);  // the reader spins for good
  }
  reader.join();
  EXPECT_FALSE(seen.made);
  // Well within the 3 s above: the read gave up on the line, it did not
  // wait for the writer.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // The other lines read as before.
  created->announce(0, 2, 6, 66);
  EXPECT_TRUE(opened->announced(0, 2).of(6));
  munmap(base, static_cast<size_t>(st.st_size));
}

TEST(ShmBoard, AReaderNeverSeesHalfAnAnnouncement) {
  TwoMappings m = mapTwice(2);
  constexpr uint32_t kCalls = 200000;
  std::thread writer([&] {
    for (uint32_t i = 0; i < kCalls; ++i) m.creator.announce(0, 0, i, uint64_t{i} * 7 + 1);
  });
  uint32_t last = 0, torn = 0;
  while (last + 1 < kCalls) {
    const Announcement seen = m.opener.announced(0, 0);
    if (!seen.made) continue;
    if (seen.check != uint64_t{seen.call} * 7 + 1) ++torn;
    EXPECT_GE(seen.call, last);  // never back in time
    last = seen.call;
  }
  writer.join();
  EXPECT_EQ(torn, 0u);
}

TEST(ShmBoard, ASleepingReaderWakesWhenThePeerPublishes) {
  TwoMappings m = mapTwice(2);
  std::thread publisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint8_t byte = 9;
    m.creator.publish(0, 1, 1, 5, &byte, 1);
  });
  const auto start = std::chrono::steady_clock::now();
  // One long sleep: it returns well before its timeout only if woken.
  m.opener.sleepUntilPublished(0, 1, 1, 10000);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  publisher.join();
  EXPECT_NE(m.opener.published(0, 1, 1), nullptr);
  EXPECT_LT(seconds, 5.0);
}

TEST(ShmBoard, ASleepEndsAtItsTimeoutWhenNothingIsPublished) {
  TwoMappings m = mapTwice(2);
  const auto start = std::chrono::steady_clock::now();
  m.opener.sleepUntilPublished(0, 0, 1, 20);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(m.opener.published(0, 0, 1), nullptr);
  EXPECT_GE(seconds, 0.015);
}

TEST(ShmBoard, OpeningWithAnotherWorldSizeFails) {
  auto created = Board::create(2, 1, 1, 48);
  ASSERT_TRUE(created.isOk());
  auto opened = Board::open(created->name(), 200, 1, 1, 48);
  EXPECT_FALSE(opened.isOk());
  EXPECT_FALSE(Board::open("/braid-no-such-board", 2, 1, 1, 48).isOk());
  // A slot size past the bound (as a corrupt card from rank 0 would say) maps nothing.
  EXPECT_FALSE(Board::open(created->name(), 2, 1, 1, kMaxBoardPayloadBytes + 1).isOk());
  EXPECT_FALSE(Board::create(2, 1, 1, uint64_t{1} << 62).isOk());
  // Lanes: at least one, and no more than the streams announced.
  EXPECT_FALSE(Board::create(2, 2, 0, 48).isOk());
  EXPECT_FALSE(Board::create(2, 2, 3, 48).isOk());
  EXPECT_FALSE(Board::open(created->name(), 2, 1, 2, 48).isOk());
}

TEST(ShmBoard, APayloadFillsTheHeaderLineThenWholeLines) {
  EXPECT_EQ(boardPayloadBytes(0), 48u);
  EXPECT_EQ(boardPayloadBytes(1), 48u);
  EXPECT_EQ(boardPayloadBytes(48), 48u);
  EXPECT_EQ(boardPayloadBytes(49), 112u);
  EXPECT_EQ(boardPayloadBytes(2048), 2096u);
}

// Each stream's lane has slots of its own: a call on one lane neither
// shows nor overwrites the same call on another.
TEST(ShmBoard, EachLaneHasItsOwnSlots) {
  TwoMappings m = mapTwice(2, 3, 48, 3);
  const int32_t a = 10, b = 20;
  m.creator.publish(1, 1, 1, 100, &a, sizeof a);
  EXPECT_EQ(m.opener.published(0, 1, 1), nullptr);
  EXPECT_EQ(m.opener.published(2, 1, 1), nullptr);
  m.creator.publish(2, 1, 1, 200, &b, sizeof b);
  ASSERT_NE(m.opener.published(1, 1, 1), nullptr);
  ASSERT_NE(m.opener.published(2, 1, 1), nullptr);
  EXPECT_EQ(m.opener.published(1, 1, 1)->check, 100u);
  EXPECT_EQ(m.opener.published(2, 1, 1)->check, 200u);
  int32_t seen = 0;
  std::memcpy(&seen, m.opener.published(1, 1, 1)->payload(), sizeof seen);
  EXPECT_EQ(seen, 10);
}

// Wide slots: every byte of every rank's two slots in every lane and every
// announcement line is its own (a slot that ran into the next, or into the
// announcements, would show here), and the payload is 16-byte aligned.
TEST(ShmBoard, WideSlotsKeepToThemselves) {
  constexpr int kRanks = 3, kStreams = 3, kLanes = 2;
  TwoMappings m = mapTwice(kRanks, kStreams, 1000, kLanes);
  const size_t bytes = m.creator.payloadBytes();
  ASSERT_EQ(bytes, boardPayloadBytes(1000));
  for (int r = 0; r < kRanks; ++r)
    for (int stream = 0; stream < kStreams; ++stream) m.creator.announce(r, stream, 40, 4000 + r);
  auto fillOf = [](int lane, int r, uint32_t sequence) {
    return static_cast<uint8_t>(64 * lane + 16 * r + sequence);
  };
  for (int lane = 0; lane < kLanes; ++lane)
    for (uint32_t sequence : {1u, 2u})
      for (int r = 0; r < kRanks; ++r) {
        std::vector<uint8_t> fill(bytes, fillOf(lane, r, sequence));
        m.creator.publish(lane, r, sequence, r, fill.data(), fill.size());
      }
  for (int lane = 0; lane < kLanes; ++lane)
    for (uint32_t sequence : {1u, 2u})
      for (int r = 0; r < kRanks; ++r) {
        const BoardSlot* slot = m.opener.published(lane, r, sequence);
        ASSERT_NE(slot, nullptr) << lane << " " << r << " " << sequence;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(slot->payload()) % 16, 0u);
        EXPECT_EQ(slot->check, static_cast<uint64_t>(r));
        const std::vector<uint8_t> want(bytes, fillOf(lane, r, sequence));
        EXPECT_EQ(std::memcmp(slot->payload(), want.data(), bytes), 0)
            << lane << " " << r << " " << sequence;
      }
  for (int r = 0; r < kRanks; ++r)
    for (int stream = 0; stream < kStreams; ++stream) {
      EXPECT_TRUE(m.opener.announced(r, stream).of(40));
      EXPECT_EQ(m.opener.announced(r, stream).check, 4000u + r);
    }
}

// Each rank counts, per peer, its calls under way with a Send or Recv to or
// from it. Four ranks, two lanes and twelve streams fill their slots and
// announcements to exactly one page: the counts lie beyond it, and the
// mapping must hold them.
TEST(ShmBoard, PointToPointCountsAreEachPairsOwn) {
  constexpr int kRanks = 4, kStreams = 12;
  TwoMappings m = mapTwice(kRanks, kStreams, 48, 2);
  for (int r = 0; r < kRanks; ++r)
    for (int stream = 0; stream < kStreams; ++stream) m.creator.announce(r, stream, 9, 90);
  m.creator.addPointToPoint(3, 2, 2);
  m.creator.addPointToPoint(3, 2, -1);
  m.creator.addPointToPoint(0, 3, 1);
  for (int r = 0; r < kRanks; ++r)
    for (int peer = 0; peer < kRanks; ++peer) {
      const uint32_t want = r == 3 && peer == 2 ? 1 : r == 0 && peer == 3 ? 1 : 0;
      EXPECT_EQ(m.opener.pointToPoint(r, peer), want) << r << " " << peer;
    }
  for (int r = 0; r < kRanks; ++r)
    for (int stream = 0; stream < kStreams; ++stream)
      EXPECT_TRUE(m.opener.announced(r, stream).of(9)) << r << " " << stream;
}

}  // namespace
}  // namespace braid::shm
