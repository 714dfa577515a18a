#include "src/board_collectives.h"

#include <poll.h>
#include <sched.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "src/call_tags.h"
#include "src/common/cpu_relax.h"
#include "src/common/reduce.h"
#include "src/common/strcat.h"
#include "src/progress.h"

namespace braid {

namespace {

using Clock = std::chrono::steady_clock;

// How often a waiting rank asks the peer's connection whether it is alive.
constexpr double kLivenessSeconds = 1e-3;
// How long one sleep on the board lasts before the checks run again.
constexpr int kSleepMs = 5;

}  // namespace

bool BoardCollectives::serves(const algo::CollectiveArgs& args) const {
  using algo::CollectiveKind;
  switch (args.kind) {
    case CollectiveKind::kBarrier:
      return true;
    case CollectiveKind::kSendRecv:
      return false;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter:
      if (!rootedCalls_) return false;
      break;
    case CollectiveKind::kReduce:
      if (!rootedCalls_) return false;
      [[fallthrough]];
    case CollectiveKind::kAllReduce:
      if (args.bytes() * static_cast<size_t>(nranks_) > kMaxReducedBytes) return false;
      break;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll:
      break;
  }
  return args.count > 0 && algo::sendBufferBytes(args) <= board_.payloadBytes();
}

Status BoardCollectives::run(const Operation& op, int stream, uint32_t callIndex,
                             const BoardWait& wait) {
  Lane& lane = lanes_[static_cast<size_t>(stream)];
  const uint32_t sequence = ++lane.sequence;
  const algo::CollectiveArgs& args = op.args;
  const CallSignature signature{static_cast<uint8_t>(args.kind), args.dtype, args.op, args.root,
                                args.count};
  const uint64_t check = signature.pack();
  board_.announce(rank_, stream, callIndex, check);
  board_.publish(stream, rank_, sequence, check, op.send,
                 op.send ? algo::sendBufferBytes(args) : 0);
  const Waiting waiting{stream, sequence, callIndex, check};
  // Every rank waits for every rank's slot, also where it reads none of
  // them (a Broadcast's), which keeps the two-slot rule: a rank publishes
  // its next call only after it finished this one.
  for (int r = 0; r < nranks_; ++r) {
    const shm::BoardSlot* slot = board_.published(stream, r, sequence);
    if (!slot) {
      BRAID_ASSIGN_OR_RETURN(slot, await(r, waiting, wait, op.name));
    }
    if (slot->check != check)
      return invalidUsage(strCat("mismatched calls: ", op.name, " on rank ", rank_, ": rank ", r,
                                 " called ", CallSignature::unpack(slot->check).describe(),
                                 ", this rank ", signature.describe(),
                                 " (every rank must make the same calls)"));
    lane.slots[static_cast<size_t>(r)] = slot;
  }
  BRAID_RETURN_IF_ERROR(checkStrays(waiting, wait, op.name));
  takeResult(op, lane.slots);
  return Status::ok();
}

void BoardCollectives::reduceSlots(void* dst, size_t offset, const algo::CollectiveArgs& args,
                                   std::span<const shm::BoardSlot* const> slots) const {
  // In rank order on every rank, so that all compute the same bits.
  reduceElements(dst, slots[0]->payload() + offset, slots[1]->payload() + offset, args.count,
                 args.dtype, args.op);
  for (int r = 2; r < nranks_; ++r)
    reduceElements(dst, dst, slots[r]->payload() + offset, args.count, args.dtype, args.op);
  if (args.op == RedOp::kAvg) applyAverage(dst, args.count, args.dtype, nranks_);
}

void BoardCollectives::takeResult(const Operation& op,
                                  std::span<const shm::BoardSlot* const> slots) const {
  using algo::CollectiveKind;
  const algo::CollectiveArgs& args = op.args;
  const size_t bytes = args.bytes();
  auto* recv = static_cast<uint8_t*>(op.recv);
  const bool isRoot = rank_ == args.root;
  switch (args.kind) {
    case CollectiveKind::kAllReduce:
      reduceSlots(recv, 0, args, slots);
      break;
    case CollectiveKind::kReduce:
      if (isRoot) reduceSlots(recv, 0, args, slots);
      break;
    case CollectiveKind::kReduceScatter:
      reduceSlots(recv, static_cast<size_t>(rank_) * bytes, args, slots);
      break;
    case CollectiveKind::kBroadcast:
      if (!isRoot || !args.inPlace) std::memcpy(recv, slots[args.root]->payload(), bytes);
      break;
    case CollectiveKind::kScatter:
      if (!isRoot || !args.inPlace)
        std::memcpy(recv, slots[args.root]->payload() + static_cast<size_t>(rank_) * bytes, bytes);
      break;
    case CollectiveKind::kGather:
      if (!isRoot) break;
      [[fallthrough]];
    case CollectiveKind::kAllGather:
      for (int r = 0; r < nranks_; ++r)
        if (r != rank_ || !args.inPlace)
          std::memcpy(recv + static_cast<size_t>(r) * bytes, slots[r]->payload(), bytes);
      break;
    case CollectiveKind::kAllToAll:
      for (int r = 0; r < nranks_; ++r)
        std::memcpy(recv + static_cast<size_t>(r) * bytes,
                    slots[r]->payload() + static_cast<size_t>(rank_) * bytes, bytes);
      break;
    case CollectiveKind::kBarrier:
    case CollectiveKind::kSendRecv:
      break;
  }
}

Status BoardCollectives::checkConnections(const Waiting& call, const BoardWait& wait,
                                          const std::string& name) const {
  // A peer that failed a call says so on its connection; one that died
  // closes its end of the connection's socket, which poll(2) shows.
  std::vector<pollfd> fds;
  std::vector<transport::Connection*> polled;
  for (transport::Connection* c : wait.connections) {
    if (Status failed = c->peerFailure(); !failed.isOk()) {
      // A peer that failed a later call did its part of this one, and its
      // connection has nothing more to read.
      if (failedInLaterCall(c->peerFailedCall(), collectiveTagBound(call.stream, call.callIndex)))
        continue;
      return Status(failed.code(), strCat(name, " on rank ", rank_, ": ", failed.message()));
    }
    if (c->pollFd() < 0) continue;
    // As before the engine sleeps: the connection then reads its socket,
    // and sees it closed, on its next progress().
    if (!c->prepareToSleep()) {
      Result<bool> moved = c->progress();
      if (!moved.isOk())
        return Status(moved.status().code(),
                      strCat(name, " on rank ", rank_, ": ", moved.status().message()));
    }
    fds.push_back({c->pollFd(), POLLIN, 0});
    polled.push_back(c);
  }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return Status::ok();
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i].revents == 0) continue;
    Result<bool> moved = polled[i]->progress();
    if (!moved.isOk())
      return Status(moved.status().code(),
                    strCat(name, " on rank ", rank_, ": ", moved.status().message()));
  }
  return Status::ok();
}

Status BoardCollectives::checkStrays(const Waiting& call, const BoardWait& wait,
                                     const std::string& name) const {
  const uint64_t below = collectiveTagBound(call.stream, call.callIndex);
  const auto channel = static_cast<uint8_t>(channelBits(call.stream, false) >> 56);
  for (transport::Connection* c : wait.connections) {
    if (!c->mayHaveUnclaimed()) continue;
    // A peer that closed after its part of this call failed nothing here;
    // the next call hears of it.
    (void)c->progress();
    if (auto stray = c->unclaimed(channel, below))
      return invalidUsage(strCat("mismatched calls: rank ", rank_, " called ", name, " ",
                                 CallSignature::unpack(call.check).describe(), " but rank ",
                                 c->peer(), " sent it a message of ",
                                 CallSignature::unpack(stray->check).describe()));
  }
  return Status::ok();
}

namespace {
const char* memoryName(bool movedGpuToGpu) {
  return movedGpuToGpu ? "GPU device memory" : "host or managed memory";
}
}  // namespace

Status BoardCollectives::checkAnnouncements(int stream, uint32_t callIndex, uint64_t check,
                                            const std::string& name) const {
  for (int peer = 0; peer < nranks_; ++peer) {
    if (peer == rank_) continue;
    const shm::Announcement seen = board_.announced(peer, stream);
    if (!seen.of(callIndex) || seen.check == check) continue;
    CallSignature theirs = CallSignature::unpack(seen.check);
    CallSignature ours = CallSignature::unpack(check);
    if ((seen.check ^ check) == CallSignature::kGpuMemoryBit) {
      ours.gpuMemory = false;
      return invalidUsage(
          // A call moves GPU to GPU only where every buffer is device
          // memory of the rank's GPU; managed memory is staged through host
          // memory, as host memory is, so the two are named together.
          strCat("mismatched calls: ", name, " ", ours.describe(), " on rank ", rank_, ": rank ",
                 peer, " passed ", memoryName(theirs.gpuMemory), " and this rank ",
                 memoryName(!theirs.gpuMemory), "; every rank must pass ", memoryName(true),
                 " (moved GPU to GPU), or every rank ", memoryName(false),
                 " (moved through host memory)"));
    }
    return invalidUsage(strCat("mismatched calls: ", name, " on rank ", rank_, ": rank ", peer,
                               " called ", theirs.describe(), ", this rank ", ours.describe(),
                               " (every rank must make the same calls)"));
  }
  return Status::ok();
}

std::vector<bool> BoardCollectives::ranksWaitingForThisRank() const {
  const int streams = board_.streams();
  // Every rank's announcements, read once.
  std::vector<shm::Announcement> seen(static_cast<size_t>(nranks_) * streams);
  for (int r = 0; r < nranks_; ++r)
    for (int stream = 0; stream < streams; ++stream)
      seen[static_cast<size_t>(r) * streams + stream] = board_.announced(r, stream);
  // Whether x waits for y: in a collective of host memory that y has not
  // announced, or in a Send or Recv with y while y has none with x (a match
  // under way on both sides ends within moments).
  auto waitsFor = [&](int x, int y) {
    for (int stream = 0; stream < streams; ++stream) {
      const shm::Announcement& theirs = seen[static_cast<size_t>(x) * streams + stream];
      if (theirs.laterThan(seen[static_cast<size_t>(y) * streams + stream]) &&
          (theirs.check & CallSignature::kGpuMemoryBit) == 0)
        return true;
    }
    return board_.pointToPoint(x, y) > 0 && board_.pointToPoint(y, x) == 0;
  };
  std::vector<bool> waiting(static_cast<size_t>(nranks_), false);
  std::vector<int> reached{rank_};  // this rank, then the ranks found waiting
  for (size_t next = 0; next < reached.size(); ++next) {
    const int y = reached[next];
    for (int x = 0; x < nranks_; ++x)
      if (x != rank_ && !waiting[x] && waitsFor(x, y)) {
        waiting[x] = true;
        reached.push_back(x);
      }
  }
  return waiting;
}

void BoardCollectives::countPointToPoint(std::span<const Operation> ops, int delta) {
  for (const Operation& op : ops)
    if (op.args.kind == algo::CollectiveKind::kSendRecv && op.peer >= 0 && op.peer < nranks_ &&
        op.peer != rank_)
      board_.addPointToPoint(rank_, op.peer, delta);
}

Status BoardCollectives::checkAnnouncement(int peer, const Waiting& call,
                                           const std::string& name) const {
  const shm::Announcement seen = board_.announced(peer, call.stream);
  if (!seen.made || seen.before(call.callIndex) ||
      (seen.of(call.callIndex) && seen.check == call.check))
    return Status::ok();
  // The peer announces a call only after it finished the one before, which
  // on the board means after it published: look once more.
  if (board_.published(call.stream, peer, call.sequence)) return Status::ok();
  const std::string ours = strCat(", this rank ", CallSignature::unpack(call.check).describe(),
                                  " (every rank must make the same calls)");
  if (seen.of(call.callIndex))
    return invalidUsage(strCat("mismatched calls: ", name, " on rank ", rank_, ": rank ", peer,
                               " called ", CallSignature::unpack(seen.check).describe(), ours));
  return invalidUsage(strCat("mismatched calls: ", name, " on rank ", rank_, ": rank ", peer,
                             " went past this call without it (its call ", seen.call, " is ",
                             CallSignature::unpack(seen.check).describe(), ")", ours));
}

Result<const shm::BoardSlot*> BoardCollectives::await(int peer, const Waiting& call,
                                                      const BoardWait& wait,
                                                      const std::string& name) {
  const uint32_t sequence = call.sequence;
  const auto start = Clock::now();
  double lastLiveness = 0;
  for (;;) {
    // A few passes between clock reads keep a peer on another core's
    // answer within a few hundred nanoseconds.
    for (int i = 0; i < 64; ++i) {
      if (const shm::BoardSlot* slot = board_.published(call.stream, peer, sequence)) return slot;
      cpuRelax();
    }
    const double idle = std::chrono::duration<double>(Clock::now() - start).count();
    if (idle < wait.pureSpinSeconds) continue;
    if (wait.aborted && wait.aborted->load(std::memory_order_relaxed))
      return invalidUsage(strCat(name, ": communicator aborted"));
    if (idle - lastLiveness >= kLivenessSeconds) {
      lastLiveness = idle;
      Status s = checkAnnouncement(peer, call, name);
      if (s.isOk()) s = checkConnections(call, wait, name);
      if (!s.isOk()) {
        // A peer that published and then left (or failed later) did its part.
        if (const shm::BoardSlot* slot = board_.published(call.stream, peer, sequence)) return slot;
        return s;
      }
    }
    if (idle >= wait.timeoutSeconds)
      return timeoutError(strCat(name, " on rank ", rank_, ": no progress for ",
                                 wait.timeoutSeconds, " s (BRAID_TIMEOUT); waiting for rank ", peer,
                                 "'s contribution to call ", call.callIndex,
                                 " on the shared-memory board"));
    if (idle < wait.spinSeconds)
      sched_yield();
    else
      board_.sleepUntilPublished(call.stream, peer, sequence, kSleepMs);
  }
}

}  // namespace braid
