// How a communicator comes up: rendezvous, the topology every rank
// publishes, connections and transports per pair, the shared-memory board
// and the link probe (create); and how one is split into others (split).
#include <algorithm>
#include <numeric>

#include "src/agreed_settings.h"
#include "src/board_collectives.h"
#include "src/common/log.h"
#include "src/common/phase_times.h"
#include "src/common/strcat.h"
#include "src/communicator.h"
#include "src/link_probe.h"
#include "src/peer_links.h"
#include "src/state_dump.h"
#include "src/stream.h"
#include "transports/completion_signal.h"
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
}  // namespace

Result<std::shared_ptr<Communicator>> Communicator::create(const RendezvousInfo& rendezvous,
                                                           int nranks, int rank, Config config,
                                                           const algo::LinkModel* parentLink,
                                                           const std::atomic<bool>* endedBy) {
  BRAID_RETURN_IF_ERROR(Selector::validate(config.algo));
  if (log::enabled(log::Level::kInfo)) installStateDumpSignal();
  // The process's completion signal (one eventfd, kept for good) is made
  // with its first communicator, not at some later call's first sleep.
  (void)transport::CompletionSignal::fd();
  Deadline deadline = Deadline::after(config.timeoutSeconds).endedBy(endedBy);
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
  auto exchanged = client.exchange(
      nranks, encodePublished(comm->tcp_->localAddress(), agreedSettings(comm->config_), local),
      deadline);
  // Where this process serves the rendezvous, its server may still be
  // answering the other ranks: were init to fail (the settings below) and the
  // process end at once, they would learn only that the connection closed,
  // not why. Once this rank has its answer the rest follow within moments.
  (void)awaitRendezvousServer(rendezvous.root, deadline);
  BRAID_ASSIGN_OR_RETURN(std::vector<std::string> published, std::move(exchanged));
  times.end("all ranks joined");
  std::vector<std::string> addresses(nranks), settings(nranks);
  std::vector<topo::RankTopology> topology(nranks);
  for (int p = 0; p < nranks; ++p) {
    BRAID_ASSIGN_OR_RETURN(Published card, decodePublished(published[p], p));
    addresses[p] = std::move(card.address);
    settings[p] = std::move(card.settings);
    topology[p] = std::move(card.topology);
  }
  BRAID_RETURN_IF_ERROR(checkAgreedSettings(settings));
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
  // An abort of this communicator from another thread ends the split
  // within moments, as it ends any call on it, rather than leaving it to
  // wait out BRAID_TIMEOUT for a rank that never joins.
  auto created = create(info, static_cast<int>(members.size()), newRank, config_,
                        oneHost ? &parentLink : nullptr, &aborted_);
  if (!created.isOk() && aborted())
    return invalidUsage(
        strCat("braidCommSplit: communicator aborted (", created.status().message(), ")"));
  return created;
}

}  // namespace braid
