#include "src/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>

#include "algorithms/algorithm.h"
#include "algorithms/fuse.h"
#include "algorithms/split.h"
#include "src/board_collectives.h"
#include "src/call_tags.h"
#include "src/common/log.h"
#include "src/common/strcat.h"
#include "src/stream.h"

namespace braid {

namespace {
// channel = 2 * stream (+1 for point to point) must stay below 0xff, the
// transports' own channel (goodbyes, acknowledgements): for every user
// stream, and for the collectives of the probe streams.
static_assert(2 * Communicator::kMaxStreams + 1 < 0xff && 2 * Communicator::kProbeStream < 0xff);
// The cuda_ipc records use the pair probe stream's point-to-point channel.
static_assert(kCudaIpcChannel == 2 * Communicator::kPairProbeStream + 1);
}  // namespace

size_t sendRecvPieceBytes(size_t bytes, size_t chunkBytes) {
  return std::max(chunkBytes, (bytes + kMostSendRecvPieces - 1) / kMostSendRecvPieces);
}

Operation byteTransfer(bool isSend, int peer, void* data, size_t bytes, std::string name) {
  Operation op;
  op.args.kind = algo::CollectiveKind::kSendRecv;
  op.args.count = bytes;
  op.args.dtype = DataType::kUint8;
  op.peer = peer;
  op.isSend = isSend;
  op.send = data;
  op.recv = data;
  op.name = std::move(name);
  return op;
}

Communicator::Communicator(int rank, int nranks, Config config)
    : rank_(rank), nranks_(nranks), config_(std::move(config)) {
  timeoutSeconds_ = config_.timeoutSeconds;
  abortFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  // Polling yields the core on every pass (sched_yield), so even with more
  // ranks than cores it beats sleeping: a wake-up through poll(2) costs tens
  // of microseconds on a VM, a yield lets the peer that has work run at once.
  double spinUs = config_.spinMicroseconds;
  if (spinUs < 0) spinUs = 500;
  spinSeconds_ = spinUs * 1e-6;
}

Communicator::~Communicator() {
  board_.reset();
  owned_.clear();
  if (abortFd_ >= 0) ::close(abortFd_);
}

Communicator::StreamState& Communicator::stream(int index) {
  std::lock_guard lock(streamsMutex_);
  auto& slot = streams_[index];
  if (!slot) {
    slot = std::make_unique<StreamState>();
    slot->sequence = config_.firstCallNumber;
  }
  return *slot;
}

uint32_t Communicator::takeCallNumber(StreamState& st, int streamIndex) {
  const uint32_t number = st.sequence++;
  if (forgetsArrivalsAt(number)) {
    const uint64_t first = collectiveTagBase(streamIndex, number);
    for (auto& c : owned_) c->forgetArrivalsBefore(first);
    std::lock_guard lock(gpuPathMutex_);
    if (gpuPath_)
      for (transport::Connection* c : gpuPath_->connections())
        if (c) c->forgetArrivalsBefore(first);
  }
  return number;
}

Result<int> Communicator::newStreamIndex() {
  std::lock_guard lock(streamsMutex_);
  if (nextStream_ > kMaxStreams)
    return invalidUsage(strCat("a communicator supports at most ", kMaxStreams, " streams"));
  return nextStream_++;
}

void Communicator::recordAsyncError(const Status& s) {
  int expected = 0;
  asyncError_.compare_exchange_strong(expected, static_cast<int>(s.code()));
}

ErrorCode Communicator::asyncError() const {
  return static_cast<ErrorCode>(asyncError_.load());
}

std::string_view Communicator::lastAlgorithm(algo::CollectiveKind kind) const {
  const auto index = static_cast<size_t>(kind);
  if (index >= lastAlgorithm_.size()) return "";
  const algo::Algorithm* algorithm = lastAlgorithm_[index].load(std::memory_order_relaxed);
  return algorithm ? algorithm->name : "";
}

const Communicator::CachedPlan& Communicator::planFor(StreamState& st,
                                                      const algo::CollectiveArgs& args,
                                                      const algo::Algorithm* requested,
                                                      size_t pieceBytes) {
  for (auto it = st.plans.begin(); it != st.plans.end(); ++it)
    if (it->args == args && it->requested == requested && it->pieceBytes == pieceBytes) {
      std::rotate(it, it + 1, st.plans.end());  // most recent last
      return st.plans.back();
    }
  if (st.plans.size() == kCachedPlans) st.plans.erase(st.plans.begin());
  CachedPlan plan;
  plan.args = args;
  plan.requested = requested;
  plan.pieceBytes = pieceBytes;
  plan.algorithm = requested ? requested : &selector_.choose(args);
  struct Planned {
    algo::Schedule schedule;
    ScheduleIndex index;
  };
  auto planned = std::make_shared<Planned>();
  planned->schedule = plan.algorithm->plan(args);
  algo::fuseReceiveReductions(planned->schedule);
  if (pieceBytes > 0)
    planned->schedule =
        algo::splitTransfers(planned->schedule, pieceBytes, dataTypeSize(args.dtype));
  planned->index = indexSchedule(planned->schedule);
  plan.index = &planned->index;
  plan.schedule = std::shared_ptr<const algo::Schedule>(planned, &planned->schedule);
  st.plans.push_back(std::move(plan));
  return st.plans.back();
}

algo::CollectiveArgs Communicator::planArgs(const Operation& op) const {
  algo::CollectiveArgs args = op.args;
  args.rank = rank_;
  args.nranks = nranks_;
  args.chunkBytes =
      gpuJobsInSlots(op) ? gpuChunkBytes(config_.cudaIpcSlotBytes) : config_.chunkBytes;
  return args;
}

namespace {

// The sizes of the pieces of `messages` cut as splitTransfers cuts them
// (pieces of `pieceBytes` rounded down to whole elements; 0: whole), the
// `most` largest, largest first.
std::vector<size_t> largestPieces(const std::vector<size_t>& messages, size_t pieceBytes,
                                  size_t elementSize, size_t most) {
  if (pieceBytes > 0) pieceBytes = algo::wholePieceBytes(pieceBytes, elementSize);
  std::vector<size_t> pieces;
  for (size_t bytes : messages) {
    if (pieceBytes == 0 || bytes <= pieceBytes) {
      pieces.push_back(bytes);
      continue;
    }
    pieces.insert(pieces.end(), std::min(most, (bytes + pieceBytes - 1) / pieceBytes), pieceBytes);
  }
  std::sort(pieces.begin(), pieces.end(), std::greater<>());
  pieces.resize(std::min(pieces.size(), most));
  return pieces;
}

}  // namespace

std::shared_ptr<const Communicator::GpuCallNeeds> Communicator::gpuCallNeeds(
    const algo::CollectiveArgs& args, const algo::Algorithm& algorithm, size_t pieceBytes) {
  std::lock_guard lock(gpuCallNeedsMutex_);
  for (auto it = gpuCallNeeds_.begin(); it != gpuCallNeeds_.end(); ++it)
    if ((*it)->args == args && (*it)->algorithm == &algorithm && (*it)->pieceBytes == pieceBytes) {
      std::rotate(it, it + 1, gpuCallNeeds_.end());
      return gpuCallNeeds_.back();
    }
  if (gpuCallNeeds_.size() == kCachedPlans) gpuCallNeeds_.erase(gpuCallNeeds_.begin());
  auto needs = std::make_shared<GpuCallNeeds>();
  needs->args = args;
  needs->algorithm = &algorithm;
  needs->pieceBytes = pieceBytes;
  // Pieces (planFor) move the same bytes: the scratch is the unsplit
  // schedule's, and the messages are its own, cut alike.
  const algo::Schedule schedule = algorithm.plan(args);
  needs->scratchBytes = schedule.scratchBytes;
  std::map<int, std::pair<std::vector<size_t>, std::vector<size_t>>> messages;
  for (const algo::Step& step : schedule.steps) {
    if (step.kind == algo::StepKind::kSend) messages[step.peer].first.push_back(step.src.bytes);
    if (algo::receives(step.kind)) messages[step.peer].second.push_back(step.dst.bytes);
  }
  for (const auto& [peer, both] : messages)
    needs->peers.push_back(
        {peer, largestPieces(both.first, pieceBytes, args.elementSize(), kReservedMessages),
         largestPieces(both.second, pieceBytes, args.elementSize(), kReservedMessages)});
  gpuCallNeeds_.push_back(std::move(needs));
  return gpuCallNeeds_.back();
}

Status Communicator::prepareGpuCalls(std::span<const Operation> ops, int streamIndex) {
  int gpuScratchTaken = 0;  // as prepare() numbers them
  for (const Operation& op : ops) {
    if (op.gpuOrdinal < 0) continue;
    BRAID_ASSIGN_OR_RETURN(GpuPath * gpu, gpuPathFor(op.gpuOrdinal));
    // Send and Recv cross through pinned memory, never over cuda_ipc, in
    // pieces (prepare()).
    if (op.args.kind == algo::CollectiveKind::kSendRecv) {
      if (op.peer < 0 || op.peer >= nranks_) continue;
      const size_t bytes = op.args.bytes();
      const std::vector<size_t> pieces =
          largestPieces({bytes}, sendRecvPieceBytes(bytes, config_.chunkBytes),
                        dataTypeSize(op.args.dtype), kReservedMessages);
      transport::Connection* to = gpu->stagedConnections()[op.peer];
      BRAID_RETURN_IF_ERROR(op.isSend ? to->reserve(pieces, {}) : to->reserve({}, pieces));
      continue;
    }
    if (!gpu->handshakesSettled()) {
      // The board tells a peer late for its first GPU call from one that
      // waits, through its calls, for a call this rank has not made.
      const BoardCollectives* board = board_.get();
      gpu->settleHandshakes(config_.cudaIpcConnectSeconds,
                            board ? std::function<std::vector<bool>()>(
                                        [board] { return board->ranksWaitingForThisRank(); })
                                  : std::function<std::vector<bool>()>());
    }
    const algo::CollectiveArgs args = planArgs(op);
    const algo::Algorithm& algorithm = op.algorithm ? *op.algorithm : selector_.choose(args);
    const size_t pieceBytes = gpu->hasStagedPeers() ? config_.chunkBytes : 0;  // as prepare()
    const auto needs = gpuCallNeeds(args, algorithm, pieceBytes);
    uint8_t* scratch = nullptr;
    if (needs->scratchBytes > 0) {
      BRAID_ASSIGN_OR_RETURN(scratch,
                             gpu->scratch(streamIndex, gpuScratchTaken++, needs->scratchBytes));
    }
    if (config_.cudaIpcDirectBytes > 0) {
      gpu->exportForReadsInPlace(op.send, algo::sendBufferBytes(args));
      gpu->exportForReadsInPlace(op.recv, algo::recvBufferBytes(args));
      gpu->exportForReadsInPlace(scratch, needs->scratchBytes);
    }
    for (const GpuCallNeeds::Peer& peer : needs->peers)
      BRAID_RETURN_IF_ERROR(gpu->connections()[peer.rank]->reserve(peer.sends, peer.recvs));
  }
  return Status::ok();
}

Status Communicator::prepare(std::span<const Operation> ops, int streamIndex,
                             std::vector<Job>* jobs,
                             std::vector<std::shared_ptr<const algo::Schedule>>* schedules) {
  StreamState& st = stream(streamIndex);
  size_t hostScratchTaken = 0;
  int gpuScratchTaken = 0;
  const size_t firstJob = jobs->size();  // ops[i] becomes (*jobs)[firstJob + i]
  bool pointToPointOnGpu = false;
  for (const Operation& op : ops) {
    std::shared_ptr<const algo::Schedule> schedule;
    Job job;
    job.send = static_cast<uint8_t*>(const_cast<void*>(op.send));
    job.recv = static_cast<uint8_t*>(op.recv);
    job.dtype = op.args.dtype;
    job.op = op.args.op;
    job.nranks = nranks_;
    job.rank = rank_;
    job.connections = connections_;
    job.timeoutSeconds = timeoutSeconds_.load();
    job.spinSeconds = spinSeconds_;
    job.pureSpinSeconds = pureSpinSeconds_;
    job.aborted = &aborted_;
    job.abortFd = abortFd_;
    const bool pointToPoint = op.args.kind == algo::CollectiveKind::kSendRecv;
    GpuPath* gpu = nullptr;
    if (op.gpuOrdinal >= 0) {
      if (pointToPoint && op.peer == rank_)
        return internalError(
            strCat(op.name, ": a Send/Recv of GPU buffers to the own rank is staged"));
      BRAID_ASSIGN_OR_RETURN(gpu, gpuPathFor(op.gpuOrdinal));
      // A Send or Recv reaches every peer, those of its own host too, through
      // pinned memory: the other end may hold host memory, and cuda_ipc
      // needs GPU memory on both.
      job.connections = pointToPoint ? gpu->stagedConnections() : gpu->connections();
      job.gpu = gpu->work();
    }
    CallSignature signature{static_cast<uint8_t>(op.args.kind), op.args.dtype, op.args.op,
                            op.args.root, op.args.count};
    // A GPU job says so in every message and announcement: a peer that runs
    // the call on host memory moves its bytes another way (over cuda_ipc, or
    // in pieces), and must fail with both calls named rather than wait. A
    // Send or Recv crosses alike whatever memory either end holds.
    signature.gpuMemory = gpu != nullptr && !pointToPoint;
    const uint64_t check = signature.pack();
    if (pointToPoint) {
      const algo::Slice data{op.isSend ? algo::BufferId::kSend : algo::BufferId::kRecv, 0,
                             op.args.bytes()};
      auto single = std::make_shared<algo::Schedule>();
      if (op.isSend)
        single->send(op.peer, data);
      else
        single->recv(op.peer, data);
      // Above BRAID_CHUNK_BYTES a Send/Recv crosses in pieces
      // (sendRecvPieceBytes), host and GPU memory alike: a GPU end stages
      // each piece through pinned memory while the wire carries the others,
      // and the other end, which cannot know what memory the first holds,
      // expects the same pieces. Both ends cut alike: the rule depends on
      // the sizes only.
      if (const size_t piece = sendRecvPieceBytes(op.args.bytes(), config_.chunkBytes);
          op.args.bytes() > piece)
        schedule = std::make_shared<const algo::Schedule>(
            algo::splitTransfers(*single, piece, dataTypeSize(op.args.dtype)));
      else
        schedule = std::move(single);
      const uint64_t pieces = schedule->steps.size();
      if (pieces >= kMessagesPerCall)
        return notSupported(strCat(op.name, ": count ", op.args.count,
                                   " needs too many messages; raise BRAID_CHUNK_BYTES"));
      // Each piece takes the next number of the pair's counter, so the tags
      // of the channel keep rising across calls of any size.
      uint64_t& counter = op.isSend ? st.sentTo[op.peer] : st.receivedFrom[op.peer];
      const uint64_t first = channelBits(streamIndex, true) | counter;
      counter += pieces;
      job.tagFor = [first, check](bool, int, uint32_t k) {
        return transport::Tag{first + k, check};
      };
      pointToPointOnGpu = pointToPointOnGpu || gpu != nullptr;
      job.callName = strCat(op.name, " (peer ", op.peer, ")");
      BRAID_TRACE("rank ", rank_, ": ", job.callName, " count ", op.args.count, " ",
                  dataTypeName(op.args.dtype), " stream ", streamIndex);
    } else {
      const algo::CollectiveArgs args = planArgs(op);
      // Messages staged through host memory are split into pieces, so that
      // the copies of one overlap the wire time of the next.
      const size_t pieceBytes = gpu && gpu->hasStagedPeers() ? config_.chunkBytes : 0;
      const CachedPlan& plan = planFor(st, args, op.algorithm, pieceBytes);
      const algo::Algorithm* algorithm = plan.algorithm;
      schedule = plan.schedule;
      job.index = plan.index;
      if (schedule->steps.size() >= kMessagesPerCall)
        return notSupported(
            strCat(op.name, ": count ", args.count, " needs too many messages; raise ",
                   gpuJobsInSlots(op) ? "BRAID_CUDA_IPC_SLOT_BYTES" : "BRAID_CHUNK_BYTES"));
      const uint32_t sequence = takeCallNumber(st, streamIndex);
      if (board_ && streamIndex <= kMaxStreams) {
        // Over cuda_ipc, a GPU job and a host call of a peer never exchange
        // a message to compare: only the board shows the two side by side.
        board_->announce(streamIndex, sequence, check);
        auto stallCheck = [board = board_.get(), streamIndex, sequence](const Job& j) {
          return board->checkAnnouncements(streamIndex, sequence, j.tagFor(false, j.rank, 0).check,
                                           j.callName);
        };
        // Held in the std::function itself (two words): no allocation per call.
        static_assert(sizeof(stallCheck) <= 2 * sizeof(void*));
        job.stallCheck = stallCheck;
      }
      const uint64_t base = collectiveTagBase(streamIndex, sequence);
      job.tagFor = [base, check](bool, int, uint32_t k) {
        return transport::Tag{collectiveTag(base, k), check};
      };
      // Not strCat: this runs on every call, and an ostringstream costs more
      // than a small message's transfer.
      job.callName = op.name + " #" + std::to_string(sequence);
      job.tagsBelow = collectiveTagBound(streamIndex, sequence);
      job.serialKey = &st;
      lastAlgorithm_[static_cast<size_t>(op.args.kind)].store(algorithm, std::memory_order_relaxed);
      BRAID_TRACE("rank ", rank_, ": ", job.callName, " ", signature.describe(), " algorithm ",
                  algorithm->name, " stream ", streamIndex, " steps ", schedule->steps.size());
      if (schedule->scratchBytes > 0 && gpu) {
        BRAID_ASSIGN_OR_RETURN(
            job.scratch, gpu->scratch(streamIndex, gpuScratchTaken++, schedule->scratchBytes));
      } else if (schedule->scratchBytes > 0) {
        if (st.scratch.size() == hostScratchTaken) st.scratch.emplace_back();
        std::vector<uint8_t>& scratch = st.scratch[hostScratchTaken++];
        if (scratch.size() < schedule->scratchBytes) scratch.resize(schedule->scratchBytes);
        job.scratch = scratch.data();
      }
    }
    job.schedule = schedule.get();
    schedules->push_back(std::move(schedule));
    jobs->push_back(std::move(job));
  }
  // A GPU job's sends reach the host connection only once their copies
  // ran, so a later call to the same peer must not overtake it: the
  // point-to-point jobs of a batch with one run one after another per peer
  // and direction (the pair's counter names it).
  if (pointToPointOnGpu)
    for (size_t i = 0; i < ops.size(); ++i)
      if (const Operation& op = ops[i]; op.args.kind == algo::CollectiveKind::kSendRecv)
        (*jobs)[firstJob + i].serialKey =
            op.isSend ? &st.sentTo[op.peer] : &st.receivedFrom[op.peer];
  return Status::ok();
}

bool Communicator::everyPeerOverCudaIpc() const {
  // The same verdict on every rank: all on one host with cuda_ipc on, or not.
  return GpuPath::built() && config_.cudaIpc && ranksOnHostOf(rank_) == nranks_;
}

bool Communicator::gpuJobsInSlots(const Operation& op) const {
  // Between hosts the wire sets the pace, in BRAID_CHUNK_BYTES.
  return op.gpuOrdinal >= 0 && everyPeerOverCudaIpc();
}

bool Communicator::gpuJobsPossible() const {
  // One rank alone runs its local copies and reductions as a GPU job too,
  // rather than through host memory.
  return GpuPath::built() && (config_.gpuStagingPipelined || everyPeerOverCudaIpc());
}

bool Communicator::gpuSendRecvPossible() const {
  return GpuPath::built() && nranks_ >= 2 && config_.gpuStagingPipelined;
}

Result<GpuPath*> Communicator::gpuPathFor(int deviceOrdinal) {
  std::lock_guard lock(gpuPathMutex_);
  if (!gpuPath_) {
    std::vector<bool> ipc(nranks_);
    for (int p = 0; p < nranks_; ++p) ipc[p] = config_.cudaIpc && sameHost_[p];
    auto made = GpuPath::create(rank_, deviceOrdinal, connections_, ipc, config_);
    if (!made.isOk())
      return failGpuJobs(made.status().code(),
                         strCat("rank ", rank_, " cannot run GPU jobs: ", made.status().message()));
    gpuPath_ = std::move(*made);
    // Peers on one GPU hand chunks over cuda_ipc. Said by the host's first
    // rank, once a process: every communicator of it would say the same.
    static std::once_flag warned;
    const bool firstOfHost =
        std::find(sameHost_.begin(), sameHost_.end(), true) == sameHost_.begin() + rank_;
    if (config_.cudaIpc && firstOfHost)
      if (const std::string warning =
              sharedGpuWarning(rank_, ranksOnHostOf(rank_), hostShares_[rank_].nvidiaGpus,
                               gpuPath_->sharedThroughMps());
          !warning.empty())
        std::call_once(warned, [&] { BRAID_WARN(warning); });
  }
  if (gpuPath_->deviceOrdinal() != deviceOrdinal)
    return failGpuJobs(
        ErrorCode::kNotSupported,
        strCat("rank ", rank_, " passed buffers on GPU ", deviceOrdinal, " after calls on GPU ",
               gpuPath_->deviceOrdinal(), ": a rank uses one GPU"));
  return gpuPath_.get();
}

Status Communicator::failGpuJobs(ErrorCode code, std::string why) {
  // The peers are about to wait for this rank's part of a GPU job: tell
  // them why it never comes, rather than let them time out.
  const Status status(code, std::move(why));
  for (int p = 0; p < nranks_; ++p)
    if (p != rank_) connections_[p]->abort(status);
  return status;
}

Status Communicator::run(std::span<const Operation> ops, int streamIndex) {
  if (ops.size() == 1 && ops[0].gpuOrdinal >= 0) return runPlain(ops, streamIndex);
  if (board_ && streamIndex < board_->lanes() && !boardBroken_.load(std::memory_order_relaxed) &&
      ops.size() == 1 && !ops[0].algorithm && board_->serves(ops[0].args) &&
      !selector_.forces(ops[0].args.kind))
    return runOnBoard(ops[0], streamIndex);
  if (measureAlgorithms_ && ops.size() == 1 && nranks_ > 1 &&
      ops[0].args.kind != algo::CollectiveKind::kSendRecv && !ops[0].algorithm &&
      !selector_.forces(ops[0].args.kind))
    return runTuned(ops[0], streamIndex);
  return runPlain(ops, streamIndex);
}

Status Communicator::runTuned(const Operation& op, int streamIndex) {
  const algo::CollectiveArgs args = planArgs(op);
  const OnlineTuner::Key key = OnlineTuner::keyFor(streamIndex, args);
  OnlineTuner::Choice choice;
  std::vector<const algo::Algorithm*> candidates;
  {
    std::lock_guard lock(tunerMutex_);
    // The model is consulted once per key; later calls only look it up.
    const algo::Algorithm* modelChoice = nullptr;
    if (!tuner_.knows(key)) {
      candidates = selector_.shortlist(args);
      modelChoice = &selector_.choose(args);
    }
    choice = tuner_.next(key, candidates, modelChoice);
  }
  Operation chosen = op;
  chosen.algorithm = choice.algorithm;
  const auto start = std::chrono::steady_clock::now();
  Status s = runPlain({&chosen, 1}, streamIndex);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!s.isOk() || choice.trial < 0) return s;
  std::vector<double> times;
  {
    std::lock_guard lock(tunerMutex_);
    if (!tuner_.record(key, choice.trial, seconds)) return s;
    times = tuner_.times(key);
  }
  // Every rank reaches this point after the same call: agree on the times,
  // the slowest rank's counting.
  Operation agree;
  agree.args.kind = algo::CollectiveKind::kAllReduce;
  agree.args.count = times.size();
  agree.args.dtype = DataType::kFloat64;
  agree.args.op = RedOp::kMax;
  agree.args.inPlace = true;
  agree.send = times.data();
  agree.recv = times.data();
  agree.name = "braid tuner";
  BRAID_RETURN_IF_ERROR(runPlain({&agree, 1}, streamIndex));
  const algo::Algorithm* decided;
  {
    std::lock_guard lock(tunerMutex_);
    decided = tuner_.decide(key, times);
    candidates = tuner_.candidates(key);
  }
  if (rank_ == 0 && log::enabled(log::Level::kInfo)) {
    std::string measured;
    for (size_t i = 0; i < candidates.size() && i < times.size(); ++i)
      measured += strCat(i ? ", " : "", candidates[i]->name, " ", times[i] * 1e6, " us");
    BRAID_INFO("tuner: ", algo::collectiveName(args.kind), " of ", args.bytes(),
               " bytes (size class ", key.sizeClass, ", stream ", streamIndex, "): ", decided->name,
               " (", measured, ")");
  }
  return s;
}

Status Communicator::runPlain(std::span<const Operation> ops, int streamIndex) {
  if (streamIndex == 0) {
    std::pair<Communicator*, std::vector<Operation>> batch{this, {ops.begin(), ops.end()}};
    return runTogether({&batch, 1});
  }
  if (aborted_)
    return invalidUsage(strCat(ops.empty() ? "call" : ops[0].name, ": communicator aborted"));
  StreamState& st = stream(streamIndex);
  std::lock_guard lock(st.order);
  std::vector<Job> jobs;
  std::vector<std::shared_ptr<const algo::Schedule>> schedules;
  BRAID_RETURN_IF_ERROR(prepare(ops, streamIndex, &jobs, &schedules));
  const CountedWhileUnderWay underWay([&](int delta) {
    if (board_) board_->countPointToPoint(ops, delta);
  });
  Status s = runJobs(jobs);
  if (!s.isOk() && aborted_) return invalidUsage(strCat(ops[0].name, ": communicator aborted"));
  return s;
}

Status Communicator::runTogether(
    std::span<std::pair<Communicator*, std::vector<Operation>>> batches) {
  // Lock the callers' streams in a fixed order so two groups over the same
  // communicators cannot deadlock on each other.
  std::vector<Communicator*> comms;
  for (auto& [comm, ops] : batches) comms.push_back(comm);
  std::sort(comms.begin(), comms.end());
  comms.erase(std::unique(comms.begin(), comms.end()), comms.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  for (Communicator* c : comms) {
    if (c->aborted_) return invalidUsage("communicator aborted");
    locks.emplace_back(c->stream(0).order);
  }
  std::vector<Job> jobs;
  std::vector<std::shared_ptr<const algo::Schedule>> schedules;
  for (auto& [comm, ops] : batches) BRAID_RETURN_IF_ERROR(comm->prepare(ops, 0, &jobs, &schedules));
  // Each communicator's board counts its Send and Recv under way.
  const CountedWhileUnderWay underWay([&](int delta) {
    for (auto& [comm, ops] : batches)
      if (comm->board_) comm->board_->countPointToPoint(ops, delta);
  });
  Status s = runJobs(jobs);
  if (!s.isOk())
    for (Communicator* c : comms)
      if (c->aborted_) return invalidUsage("communicator aborted");
  return s;
}

void Communicator::abort() {
  aborted_ = true;
  uint64_t one = 1;
  if (abortFd_ >= 0) (void)!::write(abortFd_, &one, sizeof(one));
  for (auto& c : owned_) c->abort(remoteError(strCat("rank ", rank_, " aborted the communicator")));
}

void Communicator::shutdown() {
  for (auto& c : owned_)
    c->abort(Status(ErrorCode::kOk, strCat("rank ", rank_, " destroyed the communicator")));
}

}  // namespace braid
