#include "src/peer_links.h"

#include <cstring>
#include <string_view>

#include "src/common/log.h"
#include "src/common/strcat.h"
#include "transports/faulty/faulty_connection.h"
#include "transports/shm/shm_stream.h"
#include "transports/stream_connection.h"
#include "transports/tcp/socket_stream.h"

namespace braid {

namespace {

using tcp::recvAll;
using tcp::sendAll;

// The handshake that hands a segment from its creator (the lower rank) to
// its peer: the name's length and bytes (length 0: no segment, use the
// socket) and the bytes of each of its rings, then one byte back (1:
// mapped; 0: not, use the socket). The creator sizes the rings, so the two
// ends need not agree on BRAID_SHM_BYTES or on /dev/shm's room. A pair
// that shares the segment then probes whether it may read each other's
// memory (shm::negotiateReadPeer).
constexpr uint32_t kMaxNameBytes = 255;

// The stream over a mapped segment, reading the peer's memory where the
// pair may. `singleCopyWith` collects the peers that may.
Result<std::unique_ptr<transport::ByteStream>> makeStream(int rank, int peer, tcp::Fd& fd,
                                                          shm::Segment segment, size_t ringBytes,
                                                          bool creator, const Config& config,
                                                          Deadline deadline,
                                                          std::string* singleCopyWith) {
  BRAID_ASSIGN_OR_RETURN(shm::ReadPeerVerdict verdict,
                         shm::negotiateReadPeer(fd.get(), config.shmCmaBytes > 0, deadline));
  auto stream =
      std::make_unique<shm::ShmStream>(std::move(segment), ringBytes, creator, std::move(fd), peer);
  if (verdict.peerPid > 0) {
    stream->enableReadPeer(verdict.peerPid);
    *singleCopyWith += strCat(" ", peer);
  } else if (config.shmCmaBytes > 0) {
    BRAID_INFO("rank ", rank, ": no single copy with rank ", peer, ", messages go through ",
               "the shared-memory rings: ", verdict.refused);
  }
  return std::unique_ptr<transport::ByteStream>(std::move(stream));
}

Status sendName(int fd, const std::string& name, Deadline deadline) {
  uint8_t length = static_cast<uint8_t>(name.size());
  BRAID_RETURN_IF_ERROR(sendAll(fd, {&length, 1}, deadline));
  return sendAll(fd, {reinterpret_cast<const uint8_t*>(name.data()), name.size()}, deadline);
}

Result<std::string> recvName(int fd, Deadline deadline) {
  uint8_t length = 0;
  BRAID_RETURN_IF_ERROR(recvAll(fd, {&length, 1}, deadline));
  std::string name(length, '\0');
  BRAID_RETURN_IF_ERROR(recvAll(fd, {reinterpret_cast<uint8_t*>(name.data()), length}, deadline));
  return name;
}

// Returns the shared-memory stream for the pair, or null when the pair
// falls back to the socket; `fd` is then still the caller's.
Result<std::unique_ptr<transport::ByteStream>> offerSegment(int rank, int peer, tcp::Fd& fd,
                                                            size_t ringBytes, const Config& config,
                                                            Deadline deadline,
                                                            std::string* singleCopyWith) {
  auto segment = shm::Segment::create(shm::segmentBytes(ringBytes));
  if (!segment.isOk()) {
    BRAID_WARN("rank ", rank, ": no shared memory with rank ", peer,
               ", using tcp: ", segment.status().message());
    BRAID_RETURN_IF_ERROR(sendName(fd.get(), "", deadline));
    return std::unique_ptr<transport::ByteStream>();
  }
  static_assert(kMaxNameBytes < 256);
  shm::ShmStream::initialize(*segment, ringBytes);
  BRAID_RETURN_IF_ERROR(sendName(fd.get(), segment->name(), deadline));
  const uint64_t ringBytesOnWire = ringBytes;
  BRAID_RETURN_IF_ERROR(sendAll(
      fd.get(), {reinterpret_cast<const uint8_t*>(&ringBytesOnWire), sizeof(uint64_t)}, deadline));
  uint8_t mapped = 0;
  BRAID_RETURN_IF_ERROR(recvAll(fd.get(), {&mapped, 1}, deadline));
  segment->unlink();
  if (mapped != 1) return std::unique_ptr<transport::ByteStream>();
  return makeStream(rank, peer, fd, std::move(*segment), ringBytes, true, config, deadline,
                    singleCopyWith);
}

Result<std::unique_ptr<transport::ByteStream>> acceptSegment(int rank, int peer, tcp::Fd& fd,
                                                             const Config& config,
                                                             Deadline deadline,
                                                             std::string* singleCopyWith) {
  BRAID_ASSIGN_OR_RETURN(std::string name, recvName(fd.get(), deadline));
  if (name.empty()) return std::unique_ptr<transport::ByteStream>();
  uint64_t ringBytes = 0;
  BRAID_RETURN_IF_ERROR(
      recvAll(fd.get(), {reinterpret_cast<uint8_t*>(&ringBytes), sizeof(ringBytes)}, deadline));
  if (ringBytes < shm::kMinRingBytes || ringBytes > shm::kMaxRingBytes ||
      (ringBytes & (ringBytes - 1)) != 0)
    return remoteError(strCat("rank ", peer, " offered shared-memory rings of ", ringBytes,
                              " bytes, not a power of two from ", shm::kMinRingBytes, " to ",
                              shm::kMaxRingBytes));
  auto segment = shm::Segment::open(name, shm::segmentBytes(ringBytes));
  const uint8_t mapped = segment.isOk() ? 1 : 0;
  if (!segment.isOk())
    BRAID_WARN("rank ", rank, ": cannot map rank ", peer,
               "'s shared memory, using tcp: ", segment.status().message());
  BRAID_RETURN_IF_ERROR(sendAll(fd.get(), {&mapped, 1}, deadline));
  if (!mapped) return std::unique_ptr<transport::ByteStream>();
  segment->unlink();
  return makeStream(rank, peer, fd, std::move(*segment), ringBytes, false, config, deadline,
                    singleCopyWith);
}

// Both ends say whether they can connect over RDMA (one byte each way);
// if both can, the queue pair is set up through the socket, which the
// stream then keeps. Null when either cannot: the pair keeps its socket.
Result<std::unique_ptr<transport::ByteStream>> connectIb(int rank, int peer, tcp::Fd& fd,
                                                         ib::IbEndpoint* ib, Deadline deadline) {
  const uint8_t mine = ib ? 1 : 0;
  uint8_t theirs = 0;
  BRAID_RETURN_IF_ERROR(sendAll(fd.get(), {&mine, 1}, deadline));
  BRAID_RETURN_IF_ERROR(recvAll(fd.get(), {&theirs, 1}, deadline));
  if (!mine || theirs != 1) {
    BRAID_WARN("rank ", rank, ": no RDMA with rank ", peer, " (", mine ? "the peer" : "this rank",
               " has none), using tcp");
    return std::unique_ptr<transport::ByteStream>();
  }
  return ib->connect(std::move(fd), peer, deadline);
}

}  // namespace

Result<std::vector<PeerLink>> linkPeers(int rank, std::map<int, tcp::Fd> sockets,
                                        const std::map<int, topo::Transport>& transports,
                                        const Config& config, ib::IbEndpoint* ib,
                                        Deadline deadline) {
  std::vector<PeerLink> links;
  std::string singleCopyWith;
  for (auto& [peer, fd] : sockets) {  // std::map: increasing peer order
    auto chosen = transports.find(peer);
    if (chosen == transports.end())
      return internalError(strCat("no transport chosen for rank ", peer));
    std::unique_ptr<transport::ByteStream> stream;
    if (chosen->second == topo::Transport::kShm) {
      const size_t ringBytes = config.shmRingBytes;
      if (rank < peer) {
        BRAID_ASSIGN_OR_RETURN(
            stream, offerSegment(rank, peer, fd, ringBytes, config, deadline, &singleCopyWith));
      } else {
        BRAID_ASSIGN_OR_RETURN(stream,
                               acceptSegment(rank, peer, fd, config, deadline, &singleCopyWith));
      }
      if (!stream && config.transport == "shm")
        return Status(ErrorCode::kSystemError,
                      strCat("BRAID_TRANSPORT=shm, but ranks ", std::min(rank, peer), " and ",
                             std::max(rank, peer), " could not share memory (see the warning)"));
    }
    PeerLink link;
    link.peer = peer;
    link.transport = stream ? "shm" : "tcp";
    if (chosen->second == topo::Transport::kIb) {
      BRAID_ASSIGN_OR_RETURN(stream, connectIb(rank, peer, fd, ib, deadline));
      if (!stream && config.transport == "ib")
        return Status(
            ErrorCode::kSystemError,
            strCat("BRAID_TRANSPORT=ib, but ranks ", std::min(rank, peer), " and ",
                   std::max(rank, peer), " could not connect over RDMA (see the warning)"));
      link.transport = stream ? "ib" : "tcp";
    }
    if (!stream) stream = std::make_unique<tcp::SocketStream>(std::move(fd), peer);
    transport::StreamConnection::Options options;
    // Over RDMA a descriptor costs a round trip more than streaming the
    // bytes (descriptor, read, ack) and saves the sender's copy into its
    // ring. StreamConnection's default (64 KiB) stands until a hardware NIC
    // measures the crossover; only buffers the user declared qualify.
    if (link.transport != std::string_view("ib")) options.readPeerBytes = config.shmCmaBytes;
    // BRAID_FAULTS (tests only): nothing is wrapped when it is unset.
    auto* faultyStream = transport::faulty::wrapStream(stream, config.faults, peer);
    link.connection =
        std::make_unique<transport::StreamConnection>(std::move(stream), peer, options);
    transport::faulty::wrapConnection(link.connection, faultyStream, config.faults, rank);
    links.push_back(std::move(link));
  }
  if (!singleCopyWith.empty())
    BRAID_INFO("rank ", rank, ": messages of ", config.shmCmaBytes,
               " bytes or more are copied once (process_vm_readv) with ranks", singleCopyWith);
  return links;
}

}  // namespace braid
