// Small collectives when every rank of the communicator shares one host:
// each rank publishes its send buffer on a shm::Board, waits until every
// rank has published, and takes what it needs from the slots in place
// (reducing in rank order, so every rank computes the same bits). A call is
// one write and nranks - 1 reads, with nothing planned, framed or
// allocated.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/common/status.h"
#include "src/communicator.h"
#include "transports/shm/shm_board.h"
#include "transports/transport.h"

namespace braid {

// How a board call waits for a peer, from the communicator's settings.
struct BoardWait {
  double pureSpinSeconds = 0;   // on the CPU alone
  double spinSeconds = 0;       // then yielding the core on every pass
  double timeoutSeconds = 300;  // then sleeping, until BRAID_TIMEOUT
  const std::atomic<bool>* aborted = nullptr;
  // Looked at while waiting: a peer that died or failed a call says so here.
  std::span<transport::Connection* const> connections;
};

class BoardCollectives {
 public:
  // `rootedCalls`: whether Broadcast, Reduce, Gather and Scatter may run on
  // the board, which makes every rank wait for every other; worth it only
  // where each rank has a core of its own (docs/PERFORMANCE.md).
  BoardCollectives(shm::Board board, int rank, int nranks, bool rootedCalls)
      : board_(std::move(board)),
        rank_(rank),
        nranks_(nranks),
        rootedCalls_(rootedCalls),
        lanes_(static_cast<size_t>(board_.lanes()),
               Lane{0, std::vector<const shm::BoardSlot*>(static_cast<size_t>(nranks))}) {}

  // Whether a call can run on the board (the caller checks that no
  // algorithm was asked for): a Barrier, or a collective whose send buffer
  // (the root's, where only the root sends) fits a slot, and whose
  // reduction reads at most kMaxReducedBytes of slots. The same answer on
  // every rank that makes the same call.
  bool serves(const algo::CollectiveArgs& args) const;
  // A board AllReduce reads every rank's slot, nranks * bytes, where the
  // algorithms move about 2 * bytes: at 2 ranks the two break even near
  // 16 KiB a rank (docs/PERFORMANCE.md).
  static constexpr size_t kMaxReducedBytes = 32 << 10;
  size_t payloadBytes() const { return board_.payloadBytes(); }
  // The streams whose small calls run on the board: 0 (the caller's thread)
  // to lanes() - 1, each in a lane of its own, so that calls on two streams
  // may run at once. Every stream's calls are announced.
  int lanes() const { return board_.lanes(); }

  // Runs `op` as call `callIndex` of `stream` (the communicator's count of
  // that stream's collectives, board or not); stream < lanes(), one call at
  // a time per stream.
  Status run(const Operation& op, int stream, uint32_t callIndex, const BoardWait& wait);
  // Tells the peers that this rank makes call `callIndex` of `stream`, of
  // signature `check`, through the algorithms.
  void announce(int stream, uint32_t callIndex, uint64_t check) {
    board_.announce(rank_, stream, callIndex, check);
  }
  // Non-ok when a peer announced call `callIndex` of `stream` with another
  // signature than `check` (this rank's announcement): asked by a call of
  // the algorithms that makes no progress, which then never would.
  Status checkAnnouncements(int stream, uint32_t callIndex, uint64_t check,
                            const std::string& name) const;
  // By rank: whether the rank waits, through its calls, for a call this
  // rank is still to make, and so will not reach a GPU call of its own
  // first. A rank x waits for a rank y when
  //  - x announced, on some stream, a collective of host memory that y has
  //    not announced there yet;
  //  - or x has a Send or Recv with y under way and y has none with x (a
  //    match under way on both sides ends within moments).
  // Marked: the ranks that wait for this rank, or for a marked rank. False
  // for this rank itself.
  std::vector<bool> ranksWaitingForThisRank() const;
  // This rank's Send and Recv operations under way, each counted with its
  // peer: `delta` (1 or -1) for each of `ops` (CountedWhileUnderWay).
  void countPointToPoint(std::span<const Operation> ops, int delta);

 private:
  struct Waiting {
    int stream;          // and its lane
    uint32_t sequence;   // the board call
    uint32_t callIndex;  // the stream's call
    uint64_t check;
  };
  Result<const shm::BoardSlot*> await(int peer, const Waiting& call, const BoardWait& wait,
                                      const std::string& name);
  // Non-ok when a peer's connection closed or the peer failed this call or
  // an earlier one (one that failed a later call did its part of this).
  Status checkConnections(const Waiting& call, const BoardWait& wait,
                          const std::string& name) const;
  // After a call: a message of an earlier call nobody received means a
  // peer made a call this rank did not (as the engine checks after its calls).
  Status checkStrays(const Waiting& call, const BoardWait& wait, const std::string& name) const;
  // Non-ok when `peer`'s announcement shows it made another call than this.
  Status checkAnnouncement(int peer, const Waiting& call, const std::string& name) const;
  // Once every rank published: this rank's part of the call, from `slots`
  // (the call's, by rank).
  void takeResult(const Operation& op, std::span<const shm::BoardSlot* const> slots) const;
  // dst = the reduction, in rank order, of every slot's payload at `offset`.
  void reduceSlots(void* dst, size_t offset, const algo::CollectiveArgs& args,
                   std::span<const shm::BoardSlot* const> slots) const;

  shm::Board board_;
  const int rank_, nranks_;
  const bool rootedCalls_;
  // Each lane is used by one stream's thread at a time.
  struct Lane {
    uint32_t sequence;                         // board calls so far, alike on every rank
    std::vector<const shm::BoardSlot*> slots;  // the current call's, by rank
  };
  std::vector<Lane> lanes_;
};

// Calls `count(1)` now and `count(-1)` when it goes: while a call runs, the
// board counts its Send and Recv operations as under way
// (BoardCollectives::countPointToPoint).
template <typename Count>
class CountedWhileUnderWay {
 public:
  explicit CountedWhileUnderWay(Count count) : count_(std::move(count)) { count_(1); }
  ~CountedWhileUnderWay() { count_(-1); }
  CountedWhileUnderWay(const CountedWhileUnderWay&) = delete;
  CountedWhileUnderWay& operator=(const CountedWhileUnderWay&) = delete;

 private:
  Count count_;
};

}  // namespace braid
