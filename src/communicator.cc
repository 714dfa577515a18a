#include "src/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <optional>

#include "algorithms/algorithm.h"
#include "algorithms/fuse.h"
#include "algorithms/split.h"
#include "src/board_collectives.h"
#include "src/call_tags.h"
#include "src/common/log.h"
#include "src/common/phase_times.h"
#include "src/common/strcat.h"
#include "src/link_probe.h"
#include "src/peer_links.h"
#include "src/state_dump.h"
#include "src/stream.h"
#include "transports/loopback/loopback_connection.h"
#include "transports/shm/shm_stream.h"

namespace braid {

namespace {
// What this build can carry besides TCP (which is always there).
topo::TransportSet builtTransports() {
  topo::TransportSet set;
  set.cudaIpc = false;
  set.shm = true;
  set.ib = ib::verbsBuilt();
  return set;
}

// channel = 2 * stream (+1 for point to point) must stay below 0xff, the
// transports' own channel (goodbyes, acknowledgements): for every user
// stream, and for the collectives of the probe streams.
static_assert(2 * Communicator::kMaxStreams + 1 < 0xff && 2 * Communicator::kProbeStream < 0xff);
// The cuda_ipc records use the pair probe stream's point-to-point channel.
static_assert(kCudaIpcChannel == 2 * Communicator::kPairProbeStream + 1);
}  // namespace

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

Result<std::shared_ptr<Communicator>> Communicator::create(const RendezvousInfo& rendezvous,
                                                           int nranks, int rank, Config config,
                                                           const algo::LinkModel* parentLink) {
  BRAID_RETURN_IF_ERROR(Selector::validate(config.algo));
  if (log::enabled(log::Level::kInfo)) installStateDumpSignal();
  Deadline deadline = Deadline::after(config.timeoutSeconds);
  PhaseTimes times;  // logged at the end (BRAID_DEBUG=INFO)
  BRAID_ASSIGN_OR_RETURN(RendezvousClient client,
                         RendezvousClient::connect(rendezvous, rank, deadline));
  times.end("rendezvous");
  // Publish the interface that reached rank 0: it is known to route.
  tcp::SocketAddress bindAddress = client.localAddress();
  if (!config.socketIfname.empty()) {
    BRAID_ASSIGN_OR_RETURN(bindAddress, chooseBootstrapAddress(config.socketIfname, deadline));
  }
  std::shared_ptr<Communicator> comm(new Communicator(rank, nranks, std::move(config)));
  if (comm->abortFd_ < 0) return errnoStatus("eventfd", errno);
  BRAID_ASSIGN_OR_RETURN(comm->tcp_, tcp::TcpTransport::create(bindAddress, rendezvous.secret));
  // Each rank publishes where it listens and where it runs (its topology);
  // from the same table every rank then derives the same transports.
  BRAID_ASSIGN_OR_RETURN(topo::RankTopology local,
                         topo::localTopology(comm->config_, rank, nranks));
  local.transports = builtTransports();
  // RDMA: this rank publishes ib only with a device and port it can use.
  BRAID_RETURN_IF_ERROR(ib::checkHcaSetting(comm->config_.ibHca));
  std::unique_ptr<ib::IbEndpoint> rdma;
  const std::string& forcedTransport = comm->config_.transport;
  if (local.transports.ib && (forcedTransport.empty() || forcedTransport == "ib")) {
    ib::IbSettings settings{comm->config_.ibHca,
                            comm->config_.ibGidIndex,
                            comm->config_.ibTimeout,
                            comm->config_.ibRetryCount,
                            {},
                            comm->registry_};
    // The NIC on this rank's NUMA node first, as NCCL and MPI do: its DMA
    // then stays off the link between sockets.
    for (const topo::PciDevice& d : local.devices)
      if (d.numaNode >= 0 && d.numaNode == local.numaNode)
        settings.nearFirst.insert(settings.nearFirst.end(), d.ibNames.begin(), d.ibNames.end());
    auto opened = ib::IbEndpoint::open(settings);
    if (opened.isOk()) {
      rdma = std::move(*opened);
      BRAID_INFO("rank ", rank, ": RDMA through ", rdma->description());
    } else {
      BRAID_INFO("rank ", rank, ": no RDMA: ", opened.status().message());
      if (forcedTransport == "ib")
        return Status(ErrorCode::kSystemError,
                      strCat("BRAID_TRANSPORT=ib, but rank ", rank,
                             " cannot use RDMA: ", opened.status().message()));
    }
  }
  local.transports.ib = rdma != nullptr;
  // /dev/shm's room before this communicator's segments take any of it, so
  // that the ranks of a host see about the same figure.
  Result<size_t> shmFreeBytes = shm::Segment::freeBytes();
  times.end("topology");
  BRAID_ASSIGN_OR_RETURN(
      std::vector<std::string> published,
      client.exchange(nranks, encodePublished(comm->tcp_->localAddress(), local), deadline));
  times.end("all ranks joined");
  std::vector<std::string> addresses(nranks);
  std::vector<topo::RankTopology> topology(nranks);
  for (int p = 0; p < nranks; ++p) {
    BRAID_ASSIGN_OR_RETURN(Published card, decodePublished(published[p], p));
    addresses[p] = std::move(card.address);
    topology[p] = std::move(card.topology);
  }
  comm->hostShares_ = topo::hostShares(topology);
  for (int p = 0; p < nranks; ++p)
    comm->sameHost_.push_back(topology[p].hostId == topology[rank].hostId);
  const int ranksOnHost = comm->hostShares_[rank].ranks;
  const int coresOnHost = std::max<int>(comm->hostShares_[rank].cores, local.cores.size());
  // A few microseconds of pure spinning catch a peer that answers from its
  // own core; with more ranks than cores they would only delay the peer.
  if (ranksOnHost <= coresOnHost) comm->pureSpinSeconds_ = std::min(comm->spinSeconds_, 5e-6);
  // A stream's worker and the thread that waits for it each poll before
  // they sleep only where both can have a core: polling threads beyond the
  // cores keep the ones with work off them (src/stream.h).
  comm->streamSpinSeconds_ = braid::streamSpinSeconds(ranksOnHost, coresOnHost, comm->spinSeconds_);
  // The single-copy threshold depends on how many ranks share the cores, so
  // the links get a copy of the settings with it resolved.
  Config linkConfig = comm->config_;
  const bool shmPossible = linkConfig.transport.empty() || linkConfig.transport == "shm";
  if (linkConfig.shmRingAuto && shmPossible && ranksOnHost > 1 && shmFreeBytes.isOk()) {
    // Each pair of a host maps a segment of two rings: a pair beyond the
    // room would fall back to TCP. Smaller rings cost speed only for
    // messages between their size and the single-copy threshold.
    linkConfig.shmRingBytes =
        shm::fittedRingBytes(linkConfig.shmRingBytes, *shmFreeBytes, ranksOnHost);
    const bool firstOnHost =
        std::find(comm->sameHost_.begin(), comm->sameHost_.end(), true) - comm->sameHost_.begin() ==
        rank;
    if (linkConfig.shmRingBytes < comm->config_.shmRingBytes && firstOnHost)
      BRAID_WARN("rank ", rank, ": shared-memory rings of ", linkConfig.shmRingBytes,
                 " bytes instead of ", comm->config_.shmRingBytes, ": /dev/shm has ",
                 *shmFreeBytes >> 20, " MiB free for the pairs of ", ranksOnHost,
                 " ranks on this host; enlarge it (docker run --shm-size=1g, or mount -o "
                 "remount,size=1G /dev/shm) for full speed");
  }
  if (linkConfig.shmCmaAuto) linkConfig.shmCmaBytes = singleCopyBytes(linkConfig.shmRingBytes);
  std::map<int, topo::Transport> transportTo;
  for (int p = 0; p < nranks; ++p) {
    if (p == rank) continue;
    BRAID_ASSIGN_OR_RETURN(topo::Link link, topo::chooseLink(topology, rank, p, builtTransports(),
                                                             comm->config_.transport));
    transportTo[p] = link.transport;
  }
  std::vector<int> peers;
  for (int p = 0; p < nranks; ++p)
    if (p != rank) peers.push_back(p);
  BRAID_ASSIGN_OR_RETURN(auto sockets, comm->tcp_->connectPeers(rank, peers, addresses, deadline));
  times.end("sockets");
  BRAID_ASSIGN_OR_RETURN(auto links, linkPeers(rank, std::move(sockets), transportTo, linkConfig,
                                               rdma.get(), deadline));
  times.end("shared memory and rdma");
  comm->connections_.assign(nranks, nullptr);
  comm->transportNames_.assign(nranks, "self");
  std::string linkTable;
  for (PeerLink& link : links) {
    comm->connections_[link.peer] = link.connection.get();
    comm->transportNames_[link.peer] = link.transport;
    comm->owned_.push_back(std::move(link.connection));
    if (link.peer < 16) linkTable += strCat(" ", link.peer, "=", link.transport);
  }
  BRAID_INFO("rank ", rank, " transports:", linkTable, nranks > 16 ? " ..." : "");
  comm->owned_.push_back(std::make_unique<transport::LoopbackConnection>(rank));
  comm->connections_[rank] = comm->owned_.back().get();
  BRAID_RETURN_IF_ERROR(comm->setUpBoard());
  times.end("board");
  BRAID_ASSIGN_OR_RETURN(algo::LinkModel link, probeLink(*comm, parentLink));
  times.end("link probe");
  comm->selector_ = Selector(comm->config_.algo, link);
  comm->measureAlgorithms_ = comm->config_.tune == Config::Tune::kMeasure;
  if (log::enabled(log::Level::kInfo)) {
    std::string interface = "?";
    if (auto list = tcp::listInterfaces(); list.isOk())
      for (const auto& i : *list) {
        auto mine = i.address;
        mine.setPort(bindAddress.port());
        if (mine.toString() == bindAddress.toString()) interface = i.name;
      }
    BRAID_INFO("rank ", rank, ": init took ", times.describe());
    BRAID_INFO("rank ", rank, " of ", nranks, ": interface ", interface, ", address ",
               comm->tcp_->localAddress(), ", rendezvous ", rendezvous.root.toString());
    if (rank == 0) {
      BRAID_INFO("cost model", parentLink ? " (the parent communicator's)" : "", ": alpha ",
                 link.alpha * 1e6, " us, link ", 1e-9 / link.beta, " GB/s, reduce ",
                 1e-9 / link.gamma, " GB/s (", link.busyWhenMeasured, " ranks busy, ",
                 link.contention, "x as slow as 2), ", link.ranksPerHost, " ranks on ",
                 link.coresPerHost, " cores per host");
      if (link.largeBytes > link.cachedBytes && link.cachedBytes > 0)
        BRAID_INFO("cost model out of cache (from ", link.largeBytes / (1 << 20), " MiB): link ",
                   1e-9 / link.largeBeta, " GB/s, ", link.largeContention, "x as slow as 2");
      BRAID_INFO("algorithms at ", nranks,
                 " ranks: ", comm->selector_.describe(nranks, comm->config_.chunkBytes));
      std::string table;
      for (int p = 0; p < nranks && p < 16; ++p) table += strCat(" ", p, "=", addresses[p]);
      BRAID_INFO("addresses:", table, nranks > 16 ? " ..." : "");
    }
  }
  return comm;
}

Communicator::StreamState& Communicator::stream(int index) {
  std::lock_guard lock(streamsMutex_);
  auto& slot = streams_[index];
  if (!slot) slot = std::make_unique<StreamState>();
  return *slot;
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

Status Communicator::prepare(std::span<const Operation> ops, int streamIndex,
                             std::vector<Job>* jobs,
                             std::vector<std::shared_ptr<const algo::Schedule>>* schedules) {
  StreamState& st = stream(streamIndex);
  size_t hostScratchTaken = 0;
  int gpuScratchTaken = 0;
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
    GpuPath* gpu = nullptr;
    if (op.gpuOrdinal >= 0) {
      if (op.args.kind == algo::CollectiveKind::kSendRecv)
        return internalError(strCat(op.name, ": Send/Recv of GPU buffers are staged"));
      BRAID_ASSIGN_OR_RETURN(gpu, gpuPathFor(op.gpuOrdinal));
      job.connections = gpu->connections();
      job.gpu = gpu->work();
    }
    CallSignature signature{static_cast<uint8_t>(op.args.kind), op.args.dtype, op.args.op,
                            op.args.root, op.args.count};
    // A GPU job says so in every message and announcement: a peer that runs
    // the call on host memory moves its bytes another way (over cuda_ipc, or
    // in pieces), and must fail with both calls named rather than wait.
    signature.gpuMemory = gpu != nullptr;
    const uint64_t check = signature.pack();
    if (op.args.kind == algo::CollectiveKind::kSendRecv) {
      const algo::Slice data{op.isSend ? algo::BufferId::kSend : algo::BufferId::kRecv, 0,
                             op.args.bytes()};
      auto single = std::make_shared<algo::Schedule>();
      if (op.isSend)
        single->send(op.peer, data);
      else
        single->recv(op.peer, data);
      schedule = std::move(single);
      uint64_t counter = op.isSend ? st.sentTo[op.peer]++ : st.receivedFrom[op.peer]++;
      const uint64_t value = channelBits(streamIndex, true) | counter;
      job.tagFor = [value, check](bool, int, uint32_t) { return transport::Tag{value, check}; };
      job.callName = strCat(op.name, " (peer ", op.peer, ")");
      BRAID_TRACE("rank ", rank_, ": ", job.callName, " count ", op.args.count, " ",
                  dataTypeName(op.args.dtype), " stream ", streamIndex);
    } else {
      algo::CollectiveArgs args = op.args;
      args.rank = rank_;
      args.nranks = nranks_;
      args.chunkBytes = config_.chunkBytes;
      // Messages staged through host memory are split into pieces, so that
      // the copies of one overlap the wire time of the next.
      const size_t pieceBytes = gpu && gpu->hasStagedPeers() ? config_.chunkBytes : 0;
      const CachedPlan& plan = planFor(st, args, op.algorithm, pieceBytes);
      const algo::Algorithm* algorithm = plan.algorithm;
      schedule = plan.schedule;
      job.index = plan.index;
      if (schedule->steps.size() >= kMessagesPerCall)
        return notSupported(strCat(op.name, ": count ", args.count,
                                   " needs too many messages; raise BRAID_CHUNK_BYTES"));
      const uint32_t sequence = st.sequence++;
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
      job.tagFor = [base, check](bool, int, uint32_t k) { return transport::Tag{base | k, check}; };
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
  return Status::ok();
}

bool Communicator::gpuJobsPossible() const {
  if (!GpuPath::built() || nranks_ < 2) return false;
  // Every rank reaches the same verdict: all on one host or not, alike.
  return config_.gpuStagingPipelined || (config_.cudaIpc && ranksOnHostOf(rank_) == nranks_);
}

Result<GpuPath*> Communicator::gpuPathFor(int deviceOrdinal) {
  std::lock_guard lock(gpuPathMutex_);
  if (!gpuPath_) {
    std::vector<bool> ipc(nranks_);
    for (int p = 0; p < nranks_; ++p) ipc[p] = config_.cudaIpc && sameHost_[p];
    auto made = GpuPath::create(rank_, deviceOrdinal, connections_, ipc, config_.chunkBytes,
                                config_.cudaIpcHandles);
    if (!made.isOk()) {
      // The peers are about to wait for this rank's slots: tell them why
      // they never come, rather than let them time out.
      const Status why(made.status().code(),
                       strCat("rank ", rank_, " cannot run GPU jobs: ", made.status().message()));
      for (int p = 0; p < nranks_; ++p)
        if (p != rank_) connections_[p]->abort(why);
      return why;
    }
    gpuPath_ = std::move(*made);
  }
  if (gpuPath_->deviceOrdinal() != deviceOrdinal)
    return notSupported(strCat("buffers on GPU ", deviceOrdinal, " after calls on GPU ",
                               gpuPath_->deviceOrdinal(), ": a rank uses one GPU"));
  return gpuPath_.get();
}

Status Communicator::run(std::span<const Operation> ops, int streamIndex) {
  if (ops.size() == 1 && ops[0].gpuOrdinal >= 0) return runPlain(ops, streamIndex);
  if (board_ && streamIndex == 0 && ops.size() == 1 && !ops[0].algorithm &&
      board_->serves(ops[0].args) && !selector_.forces(ops[0].args.kind))
    return runOnBoard(ops[0]);
  if (measureAlgorithms_ && ops.size() == 1 && nranks_ > 1 &&
      ops[0].args.kind != algo::CollectiveKind::kSendRecv && !ops[0].algorithm &&
      !selector_.forces(ops[0].args.kind))
    return runTuned(ops[0], streamIndex);
  return runPlain(ops, streamIndex);
}

Status Communicator::runTuned(const Operation& op, int streamIndex) {
  algo::CollectiveArgs args = op.args;
  args.rank = rank_;
  args.nranks = nranks_;
  args.chunkBytes = config_.chunkBytes;
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
  std::pair<Communicator*, std::vector<Operation>> batch{this, {ops.begin(), ops.end()}};
  if (streamIndex == 0) return runTogether({&batch, 1});
  if (aborted_)
    return invalidUsage(strCat(ops.empty() ? "call" : ops[0].name, ": communicator aborted"));
  StreamState& st = stream(streamIndex);
  std::lock_guard lock(st.order);
  std::vector<Job> jobs;
  std::vector<std::shared_ptr<const algo::Schedule>> schedules;
  BRAID_RETURN_IF_ERROR(prepare(ops, streamIndex, &jobs, &schedules));
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
  Status s = runJobs(jobs);
  if (!s.isOk())
    for (Communicator* c : comms)
      if (c->aborted_) return invalidUsage("communicator aborted");
  return s;
}

Result<std::shared_ptr<Communicator>> Communicator::split(int color, int key) {
  std::vector<int32_t> mine{color, key}, all(2 * static_cast<size_t>(nranks_));
  Operation gather;
  gather.args.kind = algo::CollectiveKind::kAllGather;
  gather.args.count = 2;
  gather.args.dtype = DataType::kInt32;
  gather.send = mine.data();
  gather.recv = all.data();
  gather.name = "braidCommSplit";
  BRAID_RETURN_IF_ERROR(run({&gather, 1}, 0));
  if (color < 0) return std::shared_ptr<Communicator>();
  std::vector<int> members;
  for (int r = 0; r < nranks_; ++r)
    if (all[2 * r] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  const int newRank =
      static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  const int leader = members[0];
  char id[kUniqueIdBytes] = {};
  std::vector<Operation> handoff;
  if (rank_ == leader) {
    RendezvousInfo info;
    BRAID_RETURN_IF_ERROR(randomBytes(info.secret));
    BRAID_ASSIGN_OR_RETURN(tcp::SocketAddress listenAt,
                           tcp::SocketAddress::parse(tcp_->localAddress()));
    listenAt.setPort(0);
    BRAID_ASSIGN_OR_RETURN(info.root,
                           startRendezvousServer(listenAt, info.secret, config_.timeoutSeconds));
    info.encode(id);
    for (size_t i = 1; i < members.size(); ++i)
      handoff.push_back(byteTransfer(true, members[i], id, kUniqueIdBytes, "braidCommSplit"));
  } else {
    handoff.push_back(byteTransfer(false, leader, id, kUniqueIdBytes, "braidCommSplit"));
  }
  BRAID_RETURN_IF_ERROR(run(handoff, 0));
  BRAID_ASSIGN_OR_RETURN(RendezvousInfo info, RendezvousInfo::decode(id));
  // The links among ranks of one host are those the parent measured: the
  // child takes its figures (every rank holds the same) rather than probing.
  const bool oneHost = ranksOnHostOf(0) == nranks_;
  const algo::LinkModel parentLink = selector_.link();
  return create(info, static_cast<int>(members.size()), newRank, config_,
                oneHost ? &parentLink : nullptr);
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
