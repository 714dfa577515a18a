// The shared-memory board of a communicator whose ranks all share one host
// over shm (src/board_collectives.h): its set-up at init, agreed by every
// rank, and the calls it serves.
#include <cstring>
#include <optional>

#include "algorithms/algorithm.h"
#include "src/board_collectives.h"
#include "src/call_tags.h"
#include "src/common/log.h"
#include "src/common/strcat.h"
#include "src/communicator.h"

namespace braid {
namespace {

// What lastAlgorithm() reports for a call that ran on the board.
constexpr algo::Algorithm kBoardAlgorithm{algo::CollectiveKind::kAllReduce, "board", nullptr,
                                          nullptr};

// What rank 0 tells the others of the board it made; an empty name: none.
struct BoardCard {
  char name[120] = {};
  uint64_t payloadBytes = 0;  // the creator's BRAID_SHM_BOARD_BYTES decides
};

}  // namespace

Status Communicator::setUpBoard() {
  if (nranks_ < 2) return Status::ok();
  bool everyPeerOnShm = true;
  for (int p = 0; p < nranks_; ++p)
    if (p != rank_)
      everyPeerOnShm = everyPeerOnShm && std::string_view(transportNames_[p]) == "shm";
  auto agree = [&](int32_t mine, const char* what) -> Result<int32_t> {
    Operation op;
    op.args.kind = algo::CollectiveKind::kAllReduce;
    op.args.count = 1;
    op.args.dtype = DataType::kInt32;
    op.args.op = RedOp::kMin;
    op.args.inPlace = true;
    op.send = op.recv = &mine;
    op.name = what;
    BRAID_RETURN_IF_ERROR(run({&op, 1}, 0));
    return mine;
  };
  const bool willing = config_.shmBoard && !config_.faults.enabled() && everyPeerOnShm;
  // 2: willing, and every rank of this host may have a core of its own.
  const topo::HostShare& host = hostShares_[rank_];
  const int32_t offer = !willing ? 0 : host.ranks <= host.cores ? 2 : 1;
  BRAID_ASSIGN_OR_RETURN(const int32_t terms, agree(offer, "braid board (willing)"));
  if (!terms) return Status::ok();
  std::optional<shm::Board> board;
  BoardCard card;
  if (rank_ == 0) {
    auto created =
        shm::Board::create(nranks_, kMaxStreams + 1, kBoardStreams, config_.shmBoardBytes);
    if (created.isOk()) {
      board = std::move(*created);
      if (board->name().size() < sizeof(card.name))
        std::memcpy(card.name, board->name().data(), board->name().size());
      card.payloadBytes = config_.shmBoardBytes;
    } else {
      BRAID_INFO("rank 0: no shared-memory board: ", created.status().message());
    }
  }
  Operation share;
  share.args.kind = algo::CollectiveKind::kBroadcast;
  share.args.count = sizeof(card);
  share.args.dtype = DataType::kUint8;
  share.args.root = 0;
  share.args.inPlace = true;
  share.send = share.recv = &card;
  share.name = "braid board (name)";
  BRAID_RETURN_IF_ERROR(run({&share, 1}, 0));
  card.name[sizeof(card.name) - 1] = 0;
  if (rank_ != 0 && card.name[0]) {
    auto opened =
        shm::Board::open(card.name, nranks_, kMaxStreams + 1, kBoardStreams, card.payloadBytes);
    if (opened.isOk())
      board = std::move(*opened);
    else
      BRAID_INFO("rank ", rank_, ": no shared-memory board: ", opened.status().message());
  }
  BRAID_ASSIGN_OR_RETURN(const int32_t all, agree(board ? 1 : 0, "braid board (mapped)"));
  if (board) board->unlink();  // every rank mapped it or gave up
  if (!all) return Status::ok();
  board_ = std::make_unique<BoardCollectives>(std::move(*board), rank_, nranks_, terms == 2);
  BRAID_INFO(
      "rank ", rank_, ": collectives whose send buffer holds up to ", board_->payloadBytes(),
      " bytes, and Barrier, through the shared-memory board",
      terms == 2 ? "" : " (not Broadcast, Reduce, Gather or Scatter: more ranks than cores)");
  return Status::ok();
}

Status Communicator::runOnBoard(const Operation& op, int streamIndex) {
  StreamState& st = stream(streamIndex);
  std::lock_guard lock(st.order);
  if (aborted_) return invalidUsage(strCat(op.name, ": communicator aborted"));
  BoardWait wait;
  wait.pureSpinSeconds = pureSpinSeconds_;
  wait.spinSeconds = spinSeconds_;
  wait.timeoutSeconds = timeoutSeconds_.load(std::memory_order_relaxed);
  wait.aborted = &aborted_;
  wait.connections = connections_;
  lastAlgorithm_[static_cast<size_t>(op.args.kind)].store(&kBoardAlgorithm,
                                                          std::memory_order_relaxed);
  BRAID_TRACE("rank ", rank_, ": ", op.name, " count ", op.args.count, " ",
              dataTypeName(op.args.dtype), " on the shared-memory board");
  const uint32_t sequence = takeCallNumber(st, streamIndex);
  Status s = board_->run(op, streamIndex, sequence, wait);
  if (s.isOk()) return s;
  if (aborted_) return invalidUsage(strCat(op.name, ": communicator aborted"));
  // As after any failed call, the communicator is broken on this rank, and
  // the peers hear why at once instead of waiting out their timeouts; a
  // peer still in an earlier call finishes it (the engine's checkPeers).
  for (auto& c : owned_) c->abortInCall(s, collectiveTagBound(streamIndex, sequence));
  boardBroken_ = true;
  return s;
}

}  // namespace braid
