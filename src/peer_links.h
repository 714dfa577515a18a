// Turns the authenticated sockets of a fresh communicator into connections:
// for each pair of ranks, shared memory when both are on one host, else the
// socket itself. The choice is made alike on both ends from the topology
// every rank published at rendezvous.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/common/deadline.h"
#include "src/common/env.h"
#include "src/common/status.h"
#include "topology/topology.h"
#include "transports/ib/ib_endpoint.h"
#include "transports/tcp/socket.h"
#include "transports/transport.h"

namespace braid {

struct PeerLink {
  int peer = -1;
  const char* transport = "";  // "shm", "ib", "tcp" (static)
  std::unique_ptr<transport::Connection> connection;
};

// `sockets` holds one connected socket per peer, `transports` the
// transport chosen for it (topo::chooseLink). A pair that should share
// memory but cannot (no room in /dev/shm) falls back to its socket, unless
// BRAID_TRANSPORT=shm. A pair that shares memory also copies large messages
// once, straight from the sender's buffer, where both ranks may read each
// other's memory (probed here; BRAID_SHM_CMA_BYTES). Pairs are set up in
// increasing order of (lower rank, higher rank) on every rank, so the
// blocking handshakes cannot wait on each other in a cycle. A pair chosen
// for ib connects a queue pair through its socket with `ib` (null when this
// rank has no RDMA; the pair then uses the socket).
Result<std::vector<PeerLink>> linkPeers(int rank, std::map<int, tcp::Fd> sockets,
                                        const std::map<int, topo::Transport>& transports,
                                        const Config& config, ib::IbEndpoint* ib,
                                        Deadline deadline);

}  // namespace braid
