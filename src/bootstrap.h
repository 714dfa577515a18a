// Rendezvous: how ranks that share a unique id (or launcher variables) find
// each other. Rank 0's side runs a small server that collects every rank's
// data-plane address and hands back the full table once all have joined.
// Every connection is authenticated with the id's secret.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "src/common/deadline.h"
#include "src/common/secret.h"
#include "src/common/status.h"
#include "topology/topology.h"
#include "transports/tcp/socket.h"

namespace braid {

inline constexpr size_t kUniqueIdBytes = 128;

struct RendezvousInfo {
  tcp::SocketAddress root;  // where the rendezvous server listens
  Secret secret{};
  // Not encoded: a unique id is made by a process whose server listens
  // from then on, so a refused connection means that the rendezvous ended;
  // a launcher's rank 0 (init from the environment) starts its server in its
  // own init, which the other ranks may reach first.
  bool serverStartsInRankZerosInit = false;

  void encode(char out[kUniqueIdBytes]) const;
  static Result<RendezvousInfo> decode(const char in[kUniqueIdBytes]);
};

// The address to publish for rank 0: BRAID_SOCKET_IFNAME's address if set,
// else the first non-loopback interface that accepts a connection to
// itself, else loopback. Returns the address with port 0.
Result<tcp::SocketAddress> chooseBootstrapAddress(const std::string& ifname, Deadline deadline);

// Starts the rendezvous server on `listenAt` (port 0 = any) on a detached
// thread that exits once every rank joined or the timeout passed. Returns
// the address it listens on. A connection has `strangerSeconds` (at most the
// timeout) to prove it knows the secret; a proven rank then has until the
// timeout to send its join request.
Result<tcp::SocketAddress> startRendezvousServer(const tcp::SocketAddress& listenAt,
                                                 const Secret& secret, double timeoutSeconds,
                                                 double strangerSeconds = 10.0);

// Waits until every rendezvous server this process started has ended; false
// if one still runs at `deadline`. A server's thread is detached (a
// uniqueId's server outlives the call that made it), so this is the one way
// to know it is done and to order its work before what follows.
bool awaitRendezvousServers(Deadline deadline);
// The same for the one server listening at `at`; true at once where this
// process runs none there.
bool awaitRendezvousServer(const tcp::SocketAddress& at, Deadline deadline);

// The rendezvous protocol after the handshake, over any tcp::Wire (a socket,
// or bytes in tests and fuzzers). A rank sends its join request: nranks and
// its data address. Rank 0 answers, once every rank joined, with code 0 and
// the address of every rank in rank order; or with an error code and why.
// Integers are 32-bit, strings a 32-bit length and their bytes.
struct JoinRequest {
  int32_t rank = -1;  // what the handshake proved; -1 without one
  uint32_t nranks = 0;
  std::string address;
};
Status sendJoinRequest(tcp::Wire& wire, int nranks, const std::string& address);
Result<JoinRequest> readJoinRequest(tcp::Wire& wire);
// Rank 0's side of a new connection: the handshake, then the join request.
Result<JoinRequest> greetJoiner(tcp::Wire& wire, const Secret& secret);
// A rank's side: the table of `nranks` addresses, or why it was refused.
Result<std::vector<std::string>> readRendezvousAnswer(tcp::Wire& wire, int nranks);

// What each rank publishes through the rendezvous, a line each: the address
// its data connections listen on, the settings every rank must share
// (src/agreed_settings.h), then its topology (RankTopology::encode).
struct Published {
  std::string address;
  std::string settings;
  topo::RankTopology topology;
};
std::string encodePublished(const std::string& address, const std::string& settings,
                            const topo::RankTopology& topology);
// `rank` is the publisher, for messages.
Result<Published> decodePublished(std::string_view text, int rank);

// Rank 0's record of who joined, apart from the sockets.
class RendezvousRoster {
 public:
  // Records `rank`, or says why it may not join: invalidUsage when the ranks
  // disagree (the whole rendezvous fails), invalidArgument when only this
  // connection is wrong.
  Status admit(int32_t rank, uint32_t nranks);
  // -1 until the first rank joined.
  int nranks() const { return nranks_; }
  bool complete() const { return nranks_ >= 0 && static_cast<int>(joined_.size()) >= nranks_; }
  const std::set<int>& joined() const { return joined_; }

 private:
  int nranks_ = -1;
  std::set<int> joined_;
};

// One rank's side: connects to the server, and returns the local address
// used to reach it (the interface to publish) through `localAddress`.
class RendezvousClient {
 public:
  static Result<RendezvousClient> connect(const RendezvousInfo& info, int rank, Deadline deadline);
  const tcp::SocketAddress& localAddress() const { return local_; }
  // Sends this rank's data address; returns every rank's, indexed by rank.
  Result<std::vector<std::string>> exchange(int nranks, const std::string& myAddress,
                                            Deadline deadline);

 private:
  tcp::Fd fd_;
  tcp::SocketAddress local_;
  int rank_ = 0;
};

}  // namespace braid
