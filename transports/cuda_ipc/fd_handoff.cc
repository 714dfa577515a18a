#include "transports/cuda_ipc/fd_handoff.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include "src/common/log.h"
#include "src/common/strcat.h"

namespace braid::transport::cuda_ipc {
namespace {

constexpr uint64_t kRequestMagic = 0x6272616964464431;  // "braidFD1"

struct Request {
  uint64_t magic;
  uint64_t server;
  uint64_t id;
  Secret proof;
};
struct Answer {
  uint32_t granted;  // 1: the descriptor comes with it
};

// The socket's name in the abstract namespace: the exporter's pid and its
// server's random number.
std::pair<sockaddr_un, socklen_t> addressOf(int32_t pid, uint64_t server) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = strCat(
      "braid-fd-", pid, "-", toHex({reinterpret_cast<const uint8_t*>(&server), sizeof(server)}));
  // sun_path[0] stays 0: the abstract namespace.
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  return {address, static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())};
}

std::string describeExporter(const FdTicket& ticket) {
  return strCat("cuda_ipc: GPU memory of process ", ticket.pid);
}

void setTimeouts(int fd, int milliseconds) {
  timeval t{milliseconds / 1000, (milliseconds % 1000) * 1000};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t));
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof(t));
}

}  // namespace

Result<std::shared_ptr<FdServer>> FdServer::start() {
  uint64_t server = 0;
  BRAID_RETURN_IF_ERROR(randomBytes({reinterpret_cast<uint8_t*>(&server), sizeof(server)}));
  tcp::Fd listener(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener.valid())
    return errnoStatus("cuda_ipc: a Unix socket to hand out GPU memory", errno);
  const auto [address, length] = addressOf(static_cast<int32_t>(getpid()), server);
  if (bind(listener.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0)
    return errnoStatus("cuda_ipc: binding the socket that hands out GPU memory", errno);
  if (listen(listener.get(), 64) != 0)
    return errnoStatus("cuda_ipc: listening on the socket that hands out GPU memory", errno);
  tcp::Fd stop(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop.valid()) return errnoStatus("cuda_ipc: an eventfd", errno);
  std::shared_ptr<FdServer> s(new FdServer(std::move(listener), std::move(stop), server));
  s->thread_ = std::thread([raw = s.get()] { raw->serve(); });
  return s;
}

FdServer::FdServer(tcp::Fd listener, tcp::Fd stop, uint64_t server)
    : listener_(std::move(listener)), stop_(std::move(stop)), server_(server) {}

FdServer::~FdServer() {
  const uint64_t one = 1;
  (void)!write(stop_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

Result<FdTicket> FdServer::offer(tcp::Fd fd) {
  FdTicket ticket;
  ticket.pid = static_cast<int32_t>(getpid());
  ticket.server = server_;
  BRAID_RETURN_IF_ERROR(randomBytes(ticket.proof));
  std::lock_guard lock(mutex_);
  ticket.id = nextId_++;
  offers_.emplace(ticket.id, Offer{std::move(fd), ticket.proof});
  return ticket;
}

void FdServer::withdraw(uint64_t id) {
  std::lock_guard lock(mutex_);
  offers_.erase(id);
}

void FdServer::serve() {
  // Connections accepted and not yet answered. Each is answered as soon as
  // its request is readable, so a client that connects and says nothing
  // holds up no one; it is closed after kSilentLimit.
  struct Pending {
    tcp::Fd client;
    std::chrono::steady_clock::time_point since;
  };
  constexpr auto kSilentLimit = std::chrono::seconds(1);
  constexpr size_t kMostPending = 64;
  std::vector<Pending> pending;
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign({{stop_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}});
    for (const Pending& p : pending) fds.push_back({p.client.get(), POLLIN, 0});
    // Wakes in time to close silent clients.
    if (poll(fds.data(), fds.size(), pending.empty() ? -1 : 100) < 0 && errno != EINTR) {
      BRAID_WARN("cuda_ipc: the server of GPU memory descriptors stops: poll: ",
                 std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) return;
    const auto now = std::chrono::steady_clock::now();
    size_t kept = 0;
    for (size_t i = 0; i < pending.size(); ++i) {
      // Readable, hung up or failed: answered (a refusal, if no request came).
      if (fds[2 + i].revents != 0) {
        answer(pending[i].client.get());
        continue;
      }
      if (now - pending[i].since >= kSilentLimit) continue;  // closed unanswered
      pending[kept++] = std::move(pending[i]);
    }
    pending.resize(kept);
    if ((fds[1].revents & POLLIN) == 0) continue;
    for (;;) {
      tcp::Fd client(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!client.valid()) break;  // EAGAIN: none left, or the peer gave up already
      // The answer's send never waits long on a client that stopped reading.
      setTimeouts(client.get(), 1000);
      // Beyond the limit the oldest goes: a flood of silent clients costs
      // the clients that asked in time nothing but a retry.
      if (pending.size() == kMostPending) pending.erase(pending.begin());
      pending.push_back({std::move(client), now});
    }
  }
}

void FdServer::answer(int client) {
  Request request{};
  Answer answer{0};
  int fd = -1;
  ucred peer{};
  socklen_t peerLength = sizeof(peer);
  if (recv(client, &request, sizeof(request), 0) == static_cast<ssize_t>(sizeof(request)) &&
      request.magic == kRequestMagic && request.server == server_ &&
      getsockopt(client, SOL_SOCKET, SO_PEERCRED, &peer, &peerLength) == 0 &&
      peer.uid == geteuid()) {
    std::lock_guard lock(mutex_);
    if (auto it = offers_.find(request.id);
        it != offers_.end() && secretEqual(it->second.proof, request.proof)) {
      answer.granted = 1;
      fd = it->second.fd.get();
    }
    // Sent under the lock: a withdrawn descriptor is closed only after.
    iovec iov{&answer, sizeof(answer)};
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (fd >= 0) {
      message.msg_control = control;
      message.msg_controllen = sizeof(control);
      cmsghdr* header = CMSG_FIRSTHDR(&message);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(header), &fd, sizeof(int));
    }
    (void)sendmsg(client, &message, MSG_NOSIGNAL);
    return;
  }
  (void)send(client, &answer, sizeof(answer), MSG_NOSIGNAL);
}

Result<tcp::Fd> connectToFdServer(const FdTicket& ticket, int timeoutMs) {
  const std::string what = describeExporter(ticket);
  tcp::Fd client(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!client.valid()) return errnoStatus(strCat(what, ": a Unix socket"), errno);
  setTimeouts(client.get(), timeoutMs);
  const auto [address, length] = addressOf(ticket.pid, ticket.server);
  if (connect(client.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0)
    return remoteError(strCat(what, ": its descriptor server cannot be reached (",
                              std::strerror(errno),
                              "); processes in different network namespaces (containers) cannot "
                              "reach it: BRAID_CUDA_IPC_HANDLES=legacy avoids descriptors"));
  return client;
}

Result<tcp::Fd> fetchFd(const FdTicket& ticket, int timeoutMs) {
  const std::string what = describeExporter(ticket);
  BRAID_ASSIGN_OR_RETURN(tcp::Fd client, connectToFdServer(ticket, timeoutMs));
  const Request request{kRequestMagic, ticket.server, ticket.id, ticket.proof};
  if (send(client.get(), &request, sizeof(request), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(sizeof(request)))
    return errnoStatus(strCat(what, ": asking for its descriptor"), errno);
  Answer answer{0};
  iovec iov{&answer, sizeof(answer)};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  const ssize_t got = recvmsg(client.get(), &message, MSG_CMSG_CLOEXEC);
  if (got < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      return timeoutError(strCat(what, ": no answer for its descriptor in ", timeoutMs, " ms"));
    return errnoStatus(strCat(what, ": receiving its descriptor"), errno);
  }
  if (got == 0)
    return remoteError(strCat(what,
                              ": its descriptor server closed the connection without an answer "
                              "(the process may be leaving)"));
  // The kernel drops a passed descriptor that this process has no room for;
  // the owner did send it.
  if ((message.msg_flags & MSG_CTRUNC) != 0)
    return systemError(strCat(what,
                              ": the descriptor it sent was dropped on arrival: this process is "
                              "at its limit of open files (ulimit -n)"));
  tcp::Fd fd;
  for (cmsghdr* h = CMSG_FIRSTHDR(&message); h != nullptr; h = CMSG_NXTHDR(&message, h)) {
    if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
        h->cmsg_len == CMSG_LEN(sizeof(int))) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(h), sizeof(int));
      fd.reset(received);
    }
  }
  if (got != static_cast<ssize_t>(sizeof(answer)) || answer.granted != 1 || !fd.valid())
    return remoteError(strCat(what,
                              ": the descriptor was refused (unknown, withdrawn, or asked "
                              "for by another user)"));
  return fd;
}

}  // namespace braid::transport::cuda_ipc
