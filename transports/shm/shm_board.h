// A board for the small collectives of ranks that all share one host: one
// segment mapped by every rank, with a lane for each of the first few
// streams (each stream's calls run in order on one thread; calls on two
// streams may run at once), and two slots per rank in each lane. A rank publishes its
// contribution to a call by writing its slot and then the slot's sequence
// number; the others read it in place once the number shows. No frames, no
// rings, no system call while the ranks are awake.
//
// A slot is a header line whose last 48 bytes start the payload, which
// runs on through the slot's further lines: a call of up to 48 bytes
// touches one cache line per rank.
//
// Two slots per rank and lane suffice: a rank writes the slot of call s + 2 only
// after it saw every rank's slot of call s + 1, which each rank publishes
// only after it finished reading call s.
//
// Each rank also announces every collective it makes, board or not, on one
// line per stream, so that a rank waiting for a contribution or a message
// that will never come can tell that its peer made another call instead;
// and counts, for each peer, its Send and Recv operations with that peer
// under way (a group's count each), so that a rank can tell a peer that
// waits for it.
//
// A reader that has waited long sleeps on the sequence word (a futex in
// the shared mapping); a publisher wakes it only when it says it sleeps.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "src/common/status.h"
#include "transports/shm/shm_segment.h"

namespace braid::shm {

// The header of a slot; its payload follows it in the mapping.
struct BoardSlot {
  static constexpr size_t kHeaderBytes = 16;
  std::atomic<uint32_t> sequence;  // the call whose contribution the slot holds
  std::atomic<uint32_t> sleepers;  // readers asleep on `sequence`
  uint64_t check;                  // what the publisher called, to compare

  // 16-byte aligned: any element type's reductions may read it in place.
  const uint8_t* payload() const { return reinterpret_cast<const uint8_t*>(this) + kHeaderBytes; }
  uint8_t* payload() { return reinterpret_cast<uint8_t*>(this) + kHeaderBytes; }
};
static_assert(sizeof(BoardSlot) == BoardSlot::kHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// The most a slot may be asked to hold (BRAID_SHM_BOARD_BYTES' bound).
constexpr size_t kMaxBoardPayloadBytes = 65536;

// The payload a slot holds when `wanted` bytes are asked for: the rest of
// the header line, plus whole cache lines (48, 112, 176, ... bytes).
size_t boardPayloadBytes(size_t wanted);

// What a rank announced: the index of its latest call and what it called.
// Call indices are 32 bits and wrap: of two, the one less than half their
// range ahead is the later.
struct Announcement {
  bool made = false;  // false: no call announced yet (or the line unreadable)
  uint32_t call = 0;  // the call's index
  uint64_t check = 0;

  // Whether the announced call is `callIndex`, or one before it.
  bool of(uint32_t callIndex) const { return made && call == callIndex; }
  bool before(uint32_t callIndex) const {
    return made && static_cast<int32_t>(call - callIndex) < 0;
  }
  // Whether this announces a later call than `other` (a call, where other
  // announces none).
  bool laterThan(const Announcement& other) const {
    return made && (!other.made || static_cast<int32_t>(call - other.call) > 0);
  }
};

class Board {
 public:
  Board() = default;
  // Rank 0 creates the board; the others open it by name, then every rank
  // calls unlink() once all have (so nothing stays in /dev/shm). `streams`
  // announcement lines per rank: streams 0 to streams - 1; `lanes` lanes of
  // slots (at most `streams`). Slots of boardPayloadBytes(payloadBytes);
  // every rank passes the same values, at most kMaxBoardPayloadBytes.
  static Result<Board> create(int nranks, int streams, int lanes, size_t payloadBytes);
  static Result<Board> open(const std::string& name, int nranks, int streams, int lanes,
                            size_t payloadBytes);
  int lanes() const { return lanes_; }
  int streams() const { return streams_; }
  const std::string& name() const { return segment_.name(); }
  size_t payloadBytes() const { return slotBytes_ - BoardSlot::kHeaderBytes; }
  void unlink() { segment_.unlink(); }

  // Writes `rank`'s contribution to call `sequence` of `lane` (bytes <=
  // payloadBytes()) and wakes the readers that sleep on it.
  void publish(int lane, int rank, uint32_t sequence, uint64_t check, const void* data,
               size_t bytes);
  // `rank`'s slot for call `sequence` of `lane` once it is published, else null.
  const BoardSlot* published(int lane, int rank, uint32_t sequence) const {
    const BoardSlot& s = slot(lane, rank, sequence);
    return s.sequence.load(std::memory_order_acquire) == sequence ? &s : nullptr;
  }
  // Sleeps until `rank` publishes call `sequence` of `lane`, at most `timeoutMs`.
  void sleepUntilPublished(int lane, int rank, uint32_t sequence, int timeoutMs);

  // `rank` starts call `callIndex` of `stream`, of signature `check`. One
  // writer per rank and stream.
  void announce(int rank, int stream, uint32_t callIndex, uint64_t check);
  // What `rank` announced last on `stream`; none (call 0) where its writer
  // stayed between its two stores for a millisecond (descheduled, or
  // killed there), which is no evidence of any call.
  Announcement announced(int rank, int stream) const;

  // `rank`'s Send and Recv operations under way with `peer`: `operations`
  // more (or fewer, when negative). Any thread of `rank` may write.
  void addPointToPoint(int rank, int peer, int operations);
  uint32_t pointToPoint(int rank, int peer) const;

  // A seqlock: `version` is odd while its owner rewrites the rest.
  struct alignas(64) AnnouncementLine {
    std::atomic<uint32_t> version;
    std::atomic<uint32_t> call;
    std::atomic<uint64_t> check;
  };

 private:
  BoardSlot& slot(int lane, int rank, uint32_t sequence) const {
    const size_t index =
        2 * (static_cast<size_t>(lane) * nranks_ + static_cast<size_t>(rank)) + (sequence & 1);
    return *reinterpret_cast<BoardSlot*>(slots_ + index * slotBytes_);
  }
  AnnouncementLine& line(int rank, int stream) const {
    return announcements_[static_cast<size_t>(rank) * streams_ + stream];
  }
  std::atomic<uint32_t>& pointToPointWord(int rank, int peer) const {
    return reinterpret_cast<std::atomic<uint32_t>*>(
        pointToPoint_ + static_cast<size_t>(rank) * pointToPointRowBytes_)[peer];
  }
  void map(int nranks, int streams, int lanes, size_t payloadBytes);

  Segment segment_;
  uint8_t* slots_ = nullptr;                   // 2 per rank and lane, of slotBytes_ each
  size_t slotBytes_ = 0;                       // a multiple of the cache line
  AnnouncementLine* announcements_ = nullptr;  // `streams_` per rank, after the slots
  uint8_t* pointToPoint_ = nullptr;            // a row per rank, after the announcements
  size_t pointToPointRowBytes_ = 0;            // nranks counts, to whole cache lines
  int streams_ = 0;
  int lanes_ = 0;
  size_t nranks_ = 0;
};

}  // namespace braid::shm
