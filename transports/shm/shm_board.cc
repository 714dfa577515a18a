#include "transports/shm/shm_board.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>

#include "src/common/strcat.h"

namespace braid::shm {

constexpr size_t kLineBytes = 64;
static_assert(sizeof(Board::AnnouncementLine) == kLineBytes);

namespace {

size_t slotBytes(size_t payloadBytes) {
  return BoardSlot::kHeaderBytes + boardPayloadBytes(payloadBytes);
}

// A rank's counts of point-to-point calls, one per peer, in cache lines of
// their own: only that rank writes them, on every Send and Recv.
size_t pointToPointRowBytes(int nranks) {
  const size_t bytes = static_cast<size_t>(nranks) * sizeof(std::atomic<uint32_t>);
  return (bytes + kLineBytes - 1) / kLineBytes * kLineBytes;
}

size_t boardBytes(int nranks, int streams, int lanes, size_t payloadBytes) {
  const size_t ranks = static_cast<size_t>(nranks);
  const size_t bytes = 2 * static_cast<size_t>(lanes) * ranks * slotBytes(payloadBytes) +
                       static_cast<size_t>(streams) * ranks * kLineBytes +
                       ranks * pointToPointRowBytes(nranks);
  const size_t page = 4096;
  return (bytes + page - 1) / page * page;
}

// Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

size_t boardPayloadBytes(size_t wanted) {
  const size_t lines = (BoardSlot::kHeaderBytes + wanted + kLineBytes - 1) / kLineBytes;
  return std::max<size_t>(lines, 1) * kLineBytes - BoardSlot::kHeaderBytes;
}

void Board::map(int nranks, int streams, int lanes, size_t payloadBytes) {
  slots_ = static_cast<uint8_t*>(segment_.base());
  slotBytes_ = slotBytes(payloadBytes);
  announcements_ = reinterpret_cast<AnnouncementLine*>(
      slots_ + 2 * static_cast<size_t>(lanes) * static_cast<size_t>(nranks) * slotBytes_);
  pointToPoint_ =
      reinterpret_cast<uint8_t*>(announcements_ + static_cast<size_t>(streams) * nranks);
  pointToPointRowBytes_ = pointToPointRowBytes(nranks);
  streams_ = streams;
  lanes_ = lanes;
  nranks_ = static_cast<size_t>(nranks);
}

namespace {
Status checkShape(int streams, int lanes, size_t payloadBytes) {
  if (payloadBytes > kMaxBoardPayloadBytes)
    return invalidArgument(
        strCat("a board slot of ", payloadBytes, " bytes (at most ", kMaxBoardPayloadBytes, ")"));
  if (lanes < 1 || lanes > streams)
    return invalidArgument(strCat("a board of ", lanes, " lanes for ", streams, " streams"));
  return Status::ok();
}
}  // namespace

Result<Board> Board::create(int nranks, int streams, int lanes, size_t payloadBytes) {
  BRAID_RETURN_IF_ERROR(checkShape(streams, lanes, payloadBytes));
  Board board;
  BRAID_ASSIGN_OR_RETURN(board.segment_,
                         Segment::create(boardBytes(nranks, streams, lanes, payloadBytes)));
  board.map(nranks, streams, lanes, payloadBytes);
  return board;
}

Result<Board> Board::open(const std::string& name, int nranks, int streams, int lanes,
                          size_t payloadBytes) {
  BRAID_RETURN_IF_ERROR(checkShape(streams, lanes, payloadBytes));
  Board board;
  BRAID_ASSIGN_OR_RETURN(board.segment_,
                         Segment::open(name, boardBytes(nranks, streams, lanes, payloadBytes)));
  board.map(nranks, streams, lanes, payloadBytes);
  return board;
}

void Board::publish(int lane, int rank, uint32_t sequence, uint64_t check, const void* data,
                    size_t bytes) {
  BoardSlot& s = slot(lane, rank, sequence);
  if (bytes) std::memcpy(s.payload(), data, bytes);
  s.check = check;
  // Sequentially consistent with the sleeper's increment of `sleepers`: either
  // it sees the new sequence before sleeping, or this sees it asleep.
  s.sequence.store(sequence, std::memory_order_seq_cst);
  if (s.sleepers.load(std::memory_order_seq_cst) != 0)
    futex(&s.sequence, FUTEX_WAKE, INT_MAX, nullptr);
}

void Board::sleepUntilPublished(int lane, int rank, uint32_t sequence, int timeoutMs) {
  BoardSlot& s = slot(lane, rank, sequence);
  s.sleepers.fetch_add(1, std::memory_order_seq_cst);
  const uint32_t seen = s.sequence.load(std::memory_order_seq_cst);
  if (seen != sequence) {
    timespec timeout{timeoutMs / 1000, (timeoutMs % 1000) * 1000000L};
    // EAGAIN (it changed meanwhile), EINTR and ETIMEDOUT all return to the
    // caller, which looks again.
    (void)futex(&s.sequence, FUTEX_WAIT, seen, &timeout);
  }
  s.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

// A seqlock without fences (which the thread sanitizer cannot follow): a
// reader that sees any field of an announcement through its acquire load
// also sees the odd version written before it, and retries.
void Board::announce(int rank, int stream, uint32_t callIndex, uint64_t check) {
  AnnouncementLine& a = line(rank, stream);
  const uint32_t version = a.version.fetch_add(1, std::memory_order_acq_rel) + 1;
  a.call.store(callIndex, std::memory_order_release);
  a.check.store(check, std::memory_order_release);
  a.version.store(version + 1, std::memory_order_release);
}

Announcement Board::announced(int rank, int stream) const {
  const AnnouncementLine& a = line(rank, stream);
  // A writer is between its two version stores for nanoseconds, unless it
  // was descheduled there or killed; then, after a millisecond, its line
  // reads as no announcement, which its readers take as no evidence (they
  // look again at their next pass, where a dead writer's sockets, the
  // timeout and an abort are looked at too).
  using Clock = std::chrono::steady_clock;
  constexpr int kSpins = 256;
  Clock::time_point giveUp{};
  for (int attempt = 0;; ++attempt) {
    const uint32_t before = a.version.load(std::memory_order_acquire);
    // Version 0: never written.
    const Announcement seen{before != 0, a.call.load(std::memory_order_acquire),
                            a.check.load(std::memory_order_acquire)};
    if ((before & 1) == 0 && a.version.load(std::memory_order_relaxed) == before) return seen;
    if (attempt < kSpins) continue;
    if (attempt == kSpins) giveUp = Clock::now() + std::chrono::milliseconds(1);
    sched_yield();
    if (Clock::now() >= giveUp) return Announcement{};
  }
}

// Relaxed: the counts order nothing else; a reader only asks whether a call
// is under way now.
void Board::addPointToPoint(int rank, int peer, int operations) {
  pointToPointWord(rank, peer)
      .fetch_add(static_cast<uint32_t>(operations), std::memory_order_relaxed);
}

uint32_t Board::pointToPoint(int rank, int peer) const {
  return pointToPointWord(rank, peer).load(std::memory_order_relaxed);
}

}  // namespace braid::shm
