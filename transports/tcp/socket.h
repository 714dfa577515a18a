// Sockets for the TCP transport and the bootstrap: an RAII fd, socket
// addresses, listening, connecting with retry until a deadline, blocking
// transfers bounded by a deadline, and the authenticated handshake.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "src/common/deadline.h"
#include "src/common/secret.h"
#include "src/common/status.h"
#include "transports/tcp/wire.h"

namespace braid::tcp {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  int family() const { return storage.ss_family; }
  uint16_t port() const;
  void setPort(uint16_t port);
  bool isLoopback() const;
  std::string toString() const;  // "1.2.3.4:5" or "[::1]:5"
  // Accepts "host:port", "[v6]:port"; host may be a name (resolved).
  static Result<SocketAddress> parse(const std::string& text);
  // The same for a numeric host only, what toString() writes: for addresses
  // that come from peers, which must not make this process ask DNS.
  static Result<SocketAddress> parseNumeric(const std::string& text);
  static Result<SocketAddress> ofSocket(int fd, bool peer);
};

// A non-loopback (or loopback) address of a local interface.
struct InterfaceAddress {
  std::string name;
  SocketAddress address;
};
Result<std::vector<InterfaceAddress>> listInterfaces();

// Listens on `address` (port 0 = any), backlog large enough for a full mesh.
Result<Fd> listenOn(const SocketAddress& address);
// Connects, retrying refused/unreachable attempts until the deadline.
// What a refused connection means to connectTo: nothing listens yet (a
// peer still starting: dial again until the deadline), or nothing listens
// any more (a server known to have been listening: kRemoteError at once).
enum class WhenRefused { kRetry, kFail };
Result<Fd> connectTo(const SocketAddress& address, Deadline deadline,
                     WhenRefused whenRefused = WhenRefused::kRetry);
// True when `fd` is connected to itself: a connect to a port nobody listens
// on, from that same port (the kernel may pick it as the source port while
// the dialled port is free), completes as a simultaneous open.
bool connectedToItself(int fd);
// Waits for one incoming connection.
Result<Fd> acceptFrom(int listenFd, Deadline deadline);

Status setNonBlocking(int fd, bool on);
Status setNoDelay(int fd);

// Blocking transfers bounded by a deadline (the fd may be nonblocking).
Status sendAll(int fd, std::span<const uint8_t> data, Deadline deadline);
Status recvAll(int fd, std::span<uint8_t> data, Deadline deadline);

// A connected socket as a Wire whose every transfer ends by `deadline`.
class SocketWire final : public Wire {
 public:
  SocketWire(int fd, Deadline deadline) : fd_(fd), deadline_(deadline) {}
  Status send(std::span<const uint8_t> data) override { return sendAll(fd_, data, deadline_); }
  Status recv(std::span<uint8_t> data) override { return recvAll(fd_, data, deadline_); }

 private:
  int fd_;
  Deadline deadline_;
};

// Mutual authentication of a fresh connection with the job's secret: both
// sides prove they know it without sending it. `purpose` separates
// bootstrap from data connections. The connecting side names its rank; the
// accepting side learns it.
Status handshakeConnect(Wire& wire, const Secret& secret, uint32_t purpose, int32_t myRank);
Result<int32_t> handshakeAccept(Wire& wire, const Secret& secret, uint32_t purpose);
Status handshakeConnect(int fd, const Secret& secret, uint32_t purpose, int32_t myRank,
                        Deadline deadline);
Result<int32_t> handshakeAccept(int fd, const Secret& secret, uint32_t purpose, Deadline deadline);

}  // namespace braid::tcp
