#include "transports/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "src/common/strcat.h"

namespace braid::tcp {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(storage).sin_port);
  return ntohs(reinterpret_cast<const sockaddr_in6&>(storage).sin6_port);
}

void SocketAddress::setPort(uint16_t port) {
  if (family() == AF_INET)
    reinterpret_cast<sockaddr_in&>(storage).sin_port = htons(port);
  else
    reinterpret_cast<sockaddr_in6&>(storage).sin6_port = htons(port);
}

bool SocketAddress::isLoopback() const {
  if (family() == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(storage).sin_addr.s_addr) >> 24) == 127;
  return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(storage).sin6_addr);
}

std::string SocketAddress::toString() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(storage).sin_addr, host, sizeof(host));
    return strCat(host, ":", port());
  }
  inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(storage).sin6_addr, host,
            sizeof(host));
  return strCat("[", host, "]:", port());
}

namespace {

Result<SocketAddress> parseAddress(const std::string& text, bool numericOnly) {
  // getaddrinfo would stop at a NUL and take what precedes it for the whole.
  if (text.find('\0') != std::string::npos) return invalidArgument("address contains a NUL byte");
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return invalidArgument(strCat("address '", text, "' is not [ipv6]:port"));
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return invalidArgument(strCat("address '", text, "' is not host:port"));
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 0 || p > 65535)
    return invalidArgument(strCat("address '", text, "' has no valid port"));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (numericOnly) hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || !found)
    return invalidArgument(strCat(numericOnly ? "not a numeric host '" : "cannot resolve host '",
                                  host, "': ", gai_strerror(rc)));
  SocketAddress out;
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.length = found->ai_addrlen;
  freeaddrinfo(found);
  out.setPort(static_cast<uint16_t>(p));
  return out;
}

}  // namespace

Result<SocketAddress> SocketAddress::parse(const std::string& text) {
  return parseAddress(text, false);
}

Result<SocketAddress> SocketAddress::parseNumeric(const std::string& text) {
  return parseAddress(text, true);
}

Result<SocketAddress> SocketAddress::ofSocket(int fd, bool peer) {
  SocketAddress out;
  out.length = sizeof(out.storage);
  int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&out.storage), &out.length)
                : getsockname(fd, reinterpret_cast<sockaddr*>(&out.storage), &out.length);
  if (rc != 0) return errnoStatus(peer ? "getpeername" : "getsockname", errno);
  return out;
}

Result<std::vector<InterfaceAddress>> listInterfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return errnoStatus("getifaddrs", errno);
  std::vector<InterfaceAddress> out;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || !(it->ifa_flags & IFF_UP)) continue;
    int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    InterfaceAddress entry;
    entry.name = it->ifa_name;
    entry.address.length = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&entry.address.storage, it->ifa_addr, entry.address.length);
    // Link-local IPv6 needs a scope id on every peer; skip it.
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(it->ifa_addr)->sin6_addr))
      continue;
    out.push_back(entry);
  }
  freeifaddrs(list);
  return out;
}

Status setNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return errnoStatus("fcntl(F_GETFL)", errno);
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) != 0) return errnoStatus("fcntl(F_SETFL)", errno);
  return Status::ok();
}

bool connectedToItself(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t localLength = sizeof(local), peerLength = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &localLength) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLength) != 0)
    return false;
  return localLength == peerLength && std::memcmp(&local, &peer, localLength) == 0;
}

Status setNoDelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
    return errnoStatus("setsockopt(TCP_NODELAY)", errno);
  return Status::ok();
}

Result<Fd> listenOn(const SocketAddress& address) {
  Fd fd(::socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errnoStatus("socket", errno);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0)
    return errnoStatus(strCat("bind to ", address.toString()), errno);
  if (::listen(fd.get(), 4096) != 0) return errnoStatus("listen", errno);
  return fd;
}

Result<Fd> connectTo(const SocketAddress& address, Deadline deadline, WhenRefused whenRefused) {
  int delayMs = 1;
  while (true) {
    Fd fd(::socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return errnoStatus("socket", errno);
    int rc =
        ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      // Up to a second for this attempt, in the deadline's slices (50 ms
      // where a flag may end it): a handshake slower than one slice goes on.
      const Deadline attempt = deadline.within(1.0);
      pollfd p{fd.get(), POLLOUT, 0};
      int ready;
      do {
        ready = ::poll(&p, 1, attempt.remainingMs(1000));
      } while ((ready == 0 || (ready < 0 && errno == EINTR)) && !attempt.expired());
      if (ready == 0) ready = ::poll(&p, 1, 0);  // done just as the attempt ran out
      if (ready > 0) {
        socklen_t len = sizeof(err);
        getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      } else {
        err = ETIMEDOUT;
      }
    }
    // Connected to itself: nothing listens at the address yet (or any more).
    if (err == 0 && connectedToItself(fd.get())) err = ECONNREFUSED;
    if (err == 0) {
      BRAID_RETURN_IF_ERROR(setNoDelay(fd.get()));
      return fd;
    }
    if (err == ECONNREFUSED && whenRefused == WhenRefused::kFail)
      return remoteError(strCat("nothing listens at ", address.toString(), " any more"));
    bool retryable = err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH ||
                     err == EHOSTUNREACH || err == ECONNRESET || err == EAGAIN;
    if (!retryable) return errnoStatus(strCat("connect to ", address.toString()), err);
    if (deadline.expired())
      return timeoutError(strCat("could not connect to ", address.toString(),
                                 " before the timeout (", strerror(err),
                                 "); is the address right and the peer running?"));
    std::this_thread::sleep_for(std::chrono::milliseconds(deadline.remainingMs(delayMs)));
    delayMs = std::min(delayMs * 2, 100);
  }
}

Result<Fd> acceptFrom(int listenFd, Deadline deadline) {
  while (true) {
    pollfd p{listenFd, POLLIN, 0};
    int ready = ::poll(&p, 1, deadline.remainingMs(1000));
    if (ready < 0 && errno != EINTR) return errnoStatus("poll on listening socket", errno);
    if (ready > 0) {
      Fd fd(::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (fd.valid()) {
        BRAID_RETURN_IF_ERROR(setNoDelay(fd.get()));
        return fd;
      }
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
        return errnoStatus("accept", errno);
    }
    if (deadline.expired()) return timeoutError("no peer connected before the timeout");
  }
}

namespace {

template <bool kSend>
Status transferAll(int fd, uint8_t* data, size_t size, Deadline deadline) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = kSend ? ::send(fd, data + done, size - done, MSG_NOSIGNAL)
                      : ::recv(fd, data + done, size - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return remoteError("connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return errno == ECONNRESET || errno == EPIPE ? remoteError("connection reset by the peer")
                                                   : errnoStatus(kSend ? "send" : "recv", errno);
    if (deadline.expired()) return timeoutError("no progress on the connection before the timeout");
    pollfd p{fd, static_cast<short>(kSend ? POLLOUT : POLLIN), 0};
    ::poll(&p, 1, deadline.remainingMs(1000));
  }
  return Status::ok();
}

constexpr uint32_t kHandshakeMagic = 0x62726169;  // "brai"

struct ConnectProof {
  uint32_t magic;
  uint32_t purpose;
  int32_t rank;
  Nonce nonce;
  Mac mac;
};

Mac proofMac(const Secret& secret, const char* label, const Nonce& a, const Nonce& b,
             uint32_t purpose, int32_t rank) {
  std::vector<uint8_t> data(label, label + std::strlen(label));
  data.insert(data.end(), a.begin(), a.end());
  data.insert(data.end(), b.begin(), b.end());
  auto append = [&](const void* p, size_t n) {
    auto* b8 = static_cast<const uint8_t*>(p);
    data.insert(data.end(), b8, b8 + n);
  };
  append(&purpose, sizeof(purpose));
  append(&rank, sizeof(rank));
  return hmac(secret, data);
}

}  // namespace

Status sendAll(int fd, std::span<const uint8_t> data, Deadline deadline) {
  return transferAll<true>(fd, const_cast<uint8_t*>(data.data()), data.size(), deadline);
}

Status recvAll(int fd, std::span<uint8_t> data, Deadline deadline) {
  return transferAll<false>(fd, data.data(), data.size(), deadline);
}

// Accepting side sends a fresh nonce; the connecting side answers with its
// rank, its own nonce and a MAC over both; the accepting side answers with a
// MAC over the connector's nonce. Neither side can be replayed.
Status handshakeConnect(Wire& wire, const Secret& secret, uint32_t purpose, int32_t myRank) {
  Nonce theirs{};
  BRAID_RETURN_IF_ERROR(wire.recv(theirs));
  ConnectProof proof{kHandshakeMagic, purpose, myRank, {}, {}};
  BRAID_RETURN_IF_ERROR(randomBytes(proof.nonce));
  proof.mac = proofMac(secret, "braid-connect", theirs, proof.nonce, purpose, myRank);
  BRAID_RETURN_IF_ERROR(wire.send({reinterpret_cast<const uint8_t*>(&proof), sizeof(proof)}));
  Mac answer{};
  Status got = wire.recv(answer);
  if (!got.isOk())
    return remoteError("the peer rejected the handshake (different secret or job?): " +
                       got.message());
  if (!macEqual(answer, proofMac(secret, "braid-accept", proof.nonce, theirs, purpose, myRank)))
    return remoteError("the peer failed authentication (it does not hold this job's secret)");
  return Status::ok();
}

Result<int32_t> handshakeAccept(Wire& wire, const Secret& secret, uint32_t purpose) {
  Nonce mine{};
  BRAID_RETURN_IF_ERROR(randomBytes(mine));
  BRAID_RETURN_IF_ERROR(wire.send(mine));
  ConnectProof proof{};
  BRAID_RETURN_IF_ERROR(wire.recv({reinterpret_cast<uint8_t*>(&proof), sizeof(proof)}));
  if (proof.magic != kHandshakeMagic || proof.purpose != purpose)
    return remoteError("a connection that is not this braid communicator's was refused");
  if (!macEqual(proof.mac,
                proofMac(secret, "braid-connect", mine, proof.nonce, purpose, proof.rank)))
    return remoteError("a connection without this job's secret was refused");
  Mac answer = proofMac(secret, "braid-accept", proof.nonce, mine, purpose, proof.rank);
  BRAID_RETURN_IF_ERROR(wire.send(answer));
  return proof.rank;
}

Status handshakeConnect(int fd, const Secret& secret, uint32_t purpose, int32_t myRank,
                        Deadline deadline) {
  SocketWire wire(fd, deadline);
  return handshakeConnect(wire, secret, purpose, myRank);
}

Result<int32_t> handshakeAccept(int fd, const Secret& secret, uint32_t purpose, Deadline deadline) {
  SocketWire wire(fd, deadline);
  return handshakeAccept(wire, secret, purpose);
}

}  // namespace braid::tcp
