#include "src/bootstrap.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

#include "src/agreed_settings.h"
#include "src/common/log.h"
#include "src/common/secret.h"
#include "src/common/strcat.h"

namespace braid {

namespace {

constexpr uint32_t kBootstrapPurpose = 1;
constexpr char kIdMagic[4] = {'B', 'R', 'D', '1'};
constexpr uint32_t kMaxAddressBytes = 256;
// What a rank publishes: its address, its shared settings and its topology,
// a line each.
constexpr uint32_t kMaxPublishedBytes =
    kMaxAddressBytes + 1 + kMaxAgreedSettingsBytes + 1 + topo::kMaxEncodedBytes;
constexpr uint32_t kMaxRefusalBytes = 4096;
// How long the process's exit waits for its rendezvous servers to end: each
// notices within some 25 ms, and its greeters' sockets are shut down.
constexpr double kStopAtExitSeconds = 2;

Status sendU32(tcp::Wire& wire, uint32_t v) {
  return wire.send({reinterpret_cast<const uint8_t*>(&v), sizeof(v)});
}
Result<uint32_t> recvU32(tcp::Wire& wire) {
  uint32_t v = 0;
  BRAID_RETURN_IF_ERROR(wire.recv({reinterpret_cast<uint8_t*>(&v), sizeof(v)}));
  return v;
}
Status sendString(tcp::Wire& wire, const std::string& s) {
  BRAID_RETURN_IF_ERROR(sendU32(wire, static_cast<uint32_t>(s.size())));
  return wire.send({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
}
Result<std::string> recvString(tcp::Wire& wire, uint32_t limit) {
  BRAID_ASSIGN_OR_RETURN(uint32_t n, recvU32(wire));
  if (n > limit) return remoteError("malformed rendezvous message");
  std::string s(n, '\0');
  BRAID_RETURN_IF_ERROR(wire.recv({reinterpret_cast<uint8_t*>(s.data()), n}));
  return s;
}

struct Joined {
  tcp::Fd fd;
  std::string address;
};

void reject(int fd, const Status& why, Deadline d) {
  tcp::SocketWire wire(fd, d);
  (void)sendU32(wire, static_cast<uint32_t>(why.code()));
  (void)sendString(wire, why.message());
}

// A connection after its handshake and join request, or why it failed.
struct Arrival {
  tcp::Fd fd;
  Result<JoinRequest> request = internalError("no handshake");
};

// Handshake and join request of one connection, on a thread of its own: a
// stranger that connects and says nothing must not hold up the ranks that
// arrive after it.
// A stranger has `step` to prove itself; a proven rank has until
// `deadline` for its join request, which it sends only after its own setup
// (transport, topology, devices), slow on a loaded host.
// `proven` is set once the handshake succeeded.
Arrival greet(tcp::Fd fd, const Secret& secret, Deadline step, Deadline deadline,
              std::atomic<bool>& proven) {
  Arrival a;
  tcp::SocketWire handshake(fd.get(), step);
  Result<int32_t> rank = tcp::handshakeAccept(handshake, secret, kBootstrapPurpose);
  if (rank.isOk()) {
    proven.store(true);
    tcp::SocketWire requestWire(fd.get(), deadline);
    Result<JoinRequest> request = readJoinRequest(requestWire);
    if (request.isOk()) request->rank = *rank;
    a.request = std::move(request);
  } else {
    a.request = rank.status();
  }
  a.fd = std::move(fd);
  return a;
}

// The rendezvous servers still running in this process.
class LiveServers {
 public:
  void started(const std::string& address) {
    std::lock_guard lock(mutex_);
    addresses_.insert(address);
    owner_.store(::getpid());
  }
  // The server thread's last act: everything it did, its greeters' work
  // included (it joined them), happens before awaitAll's return.
  void ended(const std::string& address) {
    std::lock_guard lock(mutex_);
    addresses_.erase(addresses_.find(address));
    changed_.notify_all();
  }
  // Tells every server to end now (at the process's exit: they would
  // otherwise run on, into libcrypto's cleanup, until their ranks joined).
  bool stopAll(Deadline deadline) {
    // A child forked while a server ran counts the parent's servers, whose
    // threads it does not have (and may hold their lock forever): it has
    // none to wait for.
    if (owner_.load() != ::getpid()) return true;
    stopping_.store(true);
    return awaitAll(deadline);
  }
  bool stopping() const { return stopping_.load(std::memory_order_relaxed); }
  bool awaitAll(Deadline deadline) {
    return awaitWhile(deadline, [this] { return !addresses_.empty(); });
  }
  bool awaitOne(const std::string& address, Deadline deadline) {
    if (owner_.load() != ::getpid()) return true;
    return awaitWhile(deadline, [&] { return addresses_.count(address) > 0; });
  }

 private:
  template <typename Running>
  bool awaitWhile(Deadline deadline, Running running) {
    std::unique_lock lock(mutex_);
    while (running()) {
      if (deadline.expired()) return false;
      changed_.wait_for(lock, std::chrono::milliseconds(deadline.remainingMs(50)));
    }
    return true;
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::multiset<std::string> addresses_;  // where each running server listens
  std::atomic<bool> stopping_{false};
  std::atomic<pid_t> owner_{0};  // the process whose threads these are
};

// Never destroyed: a detached server may end after static destructors ran.
LiveServers& liveServers() {
  static auto* servers = new LiveServers;
  return *servers;
}

// The threads that greet new connections. Each is joined as soon as it is
// done, not when the rendezvous ends: one stranger that keeps its connection
// silent must not leave the others' finished threads waiting (and unjoined,
// should the process exit meanwhile). A connection still being greeted when
// the rendezvous ends never became a rank: its socket is shut down, so its
// thread ends at once instead of when its handshake step runs out.
class Greeters {
 public:
  // What a greeting thread is told and tells back.
  class Handle {
   public:
    // The thread no longer reads the socket: it may hand the connection on.
    void finishedReading() const { done_->store(true); }
    // The rendezvous ended while this connection was still being greeted.
    bool cutOff() const { return cutOff_->load(); }
    // Set once the connection proved itself a rank (the handshake).
    std::atomic<bool>& proven() const { return *proven_; }

   private:
    friend class Greeters;
    std::shared_ptr<std::atomic<bool>> done_ = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<std::atomic<bool>> proven_ = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<std::atomic<bool>> cutOff_;
  };

  Greeters() = default;
  Greeters(const Greeters&) = delete;
  Greeters& operator=(const Greeters&) = delete;
  ~Greeters() {
    cutOff_->store(true);
    for (Greeter& g : greeters_) {
      if (!g.handle.done_->load() && g.socket.valid()) ::shutdown(g.socket.get(), SHUT_RDWR);
    }
    // Destroying the jthreads joins them.
  }

  // Runs greet(connection, handle) on a thread of its own; where no thread
  // can be started (the process at its limit), the connection is closed.
  template <typename Greet>
  void start(tcp::Fd fd, Greet greet) {
    Greeter g;
    g.handle.cutOff_ = cutOff_;
    // A duplicate the thread never closes: shutting it down cannot hit a
    // descriptor number the thread closed and the process reused.
    g.socket = tcp::Fd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    g.started = std::chrono::steady_clock::now();
    try {
      g.thread = std::jthread([greet = std::move(greet), fd = std::move(fd),
                               handle = g.handle]() mutable { greet(std::move(fd), handle); });
    } catch (const std::system_error& e) {
      BRAID_WARN("rendezvous: closed a connection: no thread to greet it (", e.what(), ")");
      return;
    }
    greeters_.push_back(std::move(g));
  }

  void joinFinished() {
    std::erase_if(greeters_, [](const Greeter& g) { return g.handle.done_->load(); });
  }

  // Connections still being greeted that have not proven themselves. A
  // proven one may wait long for its rank's join request, but there are at
  // most as many as ranks.
  size_t unproven() const {
    return static_cast<size_t>(
        std::count_if(greeters_.begin(), greeters_.end(), [](const Greeter& g) {
          return !g.handle.done_->load() && !g.handle.proven_->load() && !g.cutOff;
        }));
  }

  // Shuts down the unproven connection greeted longest, if it is still
  // silent after `seconds` (a rank proves itself within milliseconds); true
  // if it did.
  bool cutOffOldestSilentFor(double seconds) {
    for (Greeter& g : greeters_) {  // in the order they started
      if (g.handle.done_->load() || g.handle.proven_->load() || g.cutOff) continue;
      if (std::chrono::steady_clock::now() - g.started < std::chrono::duration<double>(seconds))
        return false;
      ::shutdown(g.socket.get(), SHUT_RDWR);
      g.cutOff = true;
      return true;
    }
    return false;
  }

 private:
  struct Greeter {
    Handle handle;
    tcp::Fd socket;
    std::chrono::steady_clock::time_point started;
    bool cutOff = false;  // shut down to make room
    std::jthread thread;
  };
  std::shared_ptr<std::atomic<bool>> cutOff_ = std::make_shared<std::atomic<bool>>(false);
  std::vector<Greeter> greeters_;
};

constexpr size_t kMaxGreeters = 96;
constexpr double kStrangerRoomSeconds = 1.0;

// Collects one join request per rank, then answers everyone with the table.
void serveRendezvous(tcp::Fd listener, Secret secret, double timeoutSeconds,
                     double strangerSeconds) {
  Deadline deadline = Deadline::after(timeoutSeconds);
  RendezvousRoster roster;
  std::map<int, Joined> joined;
  std::mutex mutex;
  std::condition_variable arrived;
  std::deque<Arrival> arrivals;
  Greeters greeters;  // after what the greeters use, so it is destroyed first
  while (!roster.complete()) {
    if (liveServers().stopping()) {
      BRAID_INFO("rendezvous: the process is exiting with ", joined.size(), " of ", roster.nranks(),
                 " ranks joined; stopped");
      return;  // closing the sockets tells the joined ranks
    }
    if (deadline.expired()) {
      BRAID_WARN("rendezvous: ", joined.size(), " of ", roster.nranks(),
                 " ranks joined before the timeout; giving up");
      return;  // closing the sockets tells the joined ranks
    }
    // New connections are greeted concurrently, by at most kMaxGreeters
    // threads (each holds two descriptors); answers are handled here. A
    // flood of silent connections has the oldest cut off after a second.
    greeters.joinFinished();
    const bool room =
        greeters.unproven() < kMaxGreeters || greeters.cutOffOldestSilentFor(kStrangerRoomSeconds);
    auto fd = room ? tcp::acceptFrom(listener.get(), Deadline::after(0.02))
                   : Result<tcp::Fd>(timeoutError("every greeter busy"));
    if (fd.isOk()) {
      Deadline step = Deadline::after(std::min(timeoutSeconds, strangerSeconds));
      greeters.start(std::move(*fd), [&, step](tcp::Fd connection, const Greeters::Handle& self) {
        Arrival a = greet(std::move(connection), secret, step, deadline, self.proven());
        self.finishedReading();
        // Logged here, not by the loop: a stranger refused after the last
        // rank joined is logged too.
        if (!a.request.isOk()) {
          if (self.cutOff())
            BRAID_INFO("rendezvous: cut off a connection that was still silent at the end");
          else
            BRAID_WARN("rendezvous: refused a connection: ", a.request.status().message());
          return;
        }
        std::lock_guard lock(mutex);
        arrivals.push_back(std::move(a));
        arrived.notify_one();
      });
    }
    greeters.joinFinished();
    std::deque<Arrival> ready;
    {
      std::unique_lock lock(mutex);
      arrived.wait_for(lock, std::chrono::milliseconds(fd.isOk() ? 0 : 5),
                       [&] { return !arrivals.empty(); });
      ready.swap(arrivals);
    }
    for (Arrival& a : ready) {
      JoinRequest& request = *a.request;
      Deadline step = Deadline::after(std::min(timeoutSeconds, 10.0));
      if (Status bad = roster.admit(request.rank, request.nranks); !bad.isOk()) {
        BRAID_WARN("rendezvous: ", bad.message());
        reject(a.fd.get(), bad, step);
        if (bad.code() == ErrorCode::kInvalidUsage) {
          for (auto& [r, j] : joined) reject(j.fd.get(), bad, step);
          return;
        }
        continue;
      }
      joined[request.rank] = {std::move(a.fd), std::move(request.address)};
    }
  }
  for (auto& [r, j] : joined) {
    tcp::SocketWire wire(j.fd.get(), Deadline::after(std::min(timeoutSeconds, 10.0)));
    if (!sendU32(wire, 0).isOk()) continue;
    for (auto& [r2, j2] : joined) (void)sendString(wire, j2.address);
  }
  BRAID_INFO("rendezvous: ", roster.nranks(), " ranks joined");
}

}  // namespace

Status sendJoinRequest(tcp::Wire& wire, int nranks, const std::string& address) {
  BRAID_RETURN_IF_ERROR(sendU32(wire, static_cast<uint32_t>(nranks)));
  return sendString(wire, address);
}

Result<JoinRequest> readJoinRequest(tcp::Wire& wire) {
  JoinRequest request;
  BRAID_ASSIGN_OR_RETURN(request.nranks, recvU32(wire));
  BRAID_ASSIGN_OR_RETURN(request.address, recvString(wire, kMaxPublishedBytes));
  return request;
}

Result<JoinRequest> greetJoiner(tcp::Wire& wire, const Secret& secret) {
  BRAID_ASSIGN_OR_RETURN(int32_t rank, tcp::handshakeAccept(wire, secret, kBootstrapPurpose));
  BRAID_ASSIGN_OR_RETURN(JoinRequest request, readJoinRequest(wire));
  request.rank = rank;
  return request;
}

Result<std::vector<std::string>> readRendezvousAnswer(tcp::Wire& wire, int nranks) {
  auto code = recvU32(wire);
  if (!code.isOk()) {
    if (code.status().code() == ErrorCode::kTimeout)
      return timeoutError(
          "not every rank joined the rendezvous before the timeout (BRAID_TIMEOUT)");
    return remoteError("the rendezvous at rank 0 ended before every rank joined: " +
                       code.status().message());
  }
  if (*code != 0) {
    BRAID_ASSIGN_OR_RETURN(std::string why, recvString(wire, kMaxRefusalBytes));
    // Only an error code of braid's is passed on; anything else (above all
    // one whose low byte is 0, kOk) would not read as a failure.
    if (*code > static_cast<uint32_t>(ErrorCode::kNotSupported))
      return remoteError(strCat("rendezvous refused with unknown code ", *code, ": ", why));
    return Status(static_cast<ErrorCode>(*code), "rendezvous refused: " + why);
  }
  std::vector<std::string> addresses(nranks);
  for (auto& a : addresses) {
    BRAID_ASSIGN_OR_RETURN(a, recvString(wire, kMaxPublishedBytes));
  }
  return addresses;
}

std::string encodePublished(const std::string& address, const std::string& settings,
                            const topo::RankTopology& topology) {
  return address + "\n" + settings + "\n" + topology.encode();
}

Result<Published> decodePublished(std::string_view text, int rank) {
  const size_t afterAddress = text.find('\n');
  const size_t afterSettings =
      afterAddress == std::string_view::npos ? afterAddress : text.find('\n', afterAddress + 1);
  if (afterSettings == std::string_view::npos)
    return internalError(strCat("rank ", rank, " published no settings or topology at rendezvous"));
  Published out;
  out.address = std::string(text.substr(0, afterAddress));
  out.settings = std::string(text.substr(afterAddress + 1, afterSettings - afterAddress - 1));
  auto decoded = topo::RankTopology::decode(text.substr(afterSettings + 1));
  if (!decoded.isOk())
    return decoded.status().withContext(strCat("the topology rank ", rank, " published"));
  out.topology = std::move(*decoded);
  return out;
}

Status RendezvousRoster::admit(int32_t rank, uint32_t nranks) {
  const int n = static_cast<int>(nranks);
  if (nranks_ >= 0 && n != nranks_)
    return invalidUsage(
        strCat("rank ", rank, " joined with nranks=", n, " but others with nranks=", nranks_));
  if (rank < 0 || rank >= n)
    return invalidArgument(strCat("rank ", rank, " is out of range for nranks=", n));
  if (joined_.count(rank)) return invalidUsage(strCat("rank ", rank, " joined twice"));
  nranks_ = n;
  joined_.insert(rank);
  return Status::ok();
}

void RendezvousInfo::encode(char out[kUniqueIdBytes]) const {
  std::memset(out, 0, kUniqueIdBytes);
  std::memcpy(out, kIdMagic, 4);
  std::string text = root.toString();
  out[4] = static_cast<char>(text.size());
  std::memcpy(out + 8, secret.data(), secret.size());
  std::memcpy(out + 24, text.data(), std::min<size_t>(text.size(), kUniqueIdBytes - 24));
}

Result<RendezvousInfo> RendezvousInfo::decode(const char in[kUniqueIdBytes]) {
  if (std::memcmp(in, kIdMagic, 4) != 0)
    return invalidArgument(
        "uniqueId is not a braid unique id (bad magic); was it made by braidGetUniqueId?");
  size_t len = static_cast<uint8_t>(in[4]);
  if (len == 0 || len > kUniqueIdBytes - 24) return invalidArgument("uniqueId is malformed");
  RendezvousInfo info;
  std::memcpy(info.secret.data(), in + 8, info.secret.size());
  // braidGetUniqueId writes a number: a name would only make this wait on DNS.
  auto address = tcp::SocketAddress::parseNumeric(std::string(in + 24, len));
  if (!address.isOk())
    return invalidArgument("uniqueId is malformed: " + address.status().message());
  info.root = *address;
  return info;
}

Result<tcp::SocketAddress> chooseBootstrapAddress(const std::string& ifname, Deadline deadline) {
  BRAID_ASSIGN_OR_RETURN(auto interfaces, tcp::listInterfaces());
  // IPv4 first: it needs no scope and is what most clusters route.
  std::stable_sort(interfaces.begin(), interfaces.end(), [](const auto& a, const auto& b) {
    return a.address.family() == AF_INET && b.address.family() != AF_INET;
  });
  if (!ifname.empty()) {
    std::string names;
    for (const auto& i : interfaces) {
      if (i.name == ifname) return i.address;
      names += " " + i.name;
    }
    return invalidArgument(strCat("BRAID_SOCKET_IFNAME=", ifname,
                                  ": no such interface with an address (have:", names, ")"));
  }
  for (const auto& i : interfaces) {
    if (i.address.isLoopback()) continue;
    // Verified, not guessed: the address must accept a connection.
    auto listener = tcp::listenOn(i.address);
    if (!listener.isOk()) continue;
    auto bound = tcp::SocketAddress::ofSocket(listener->get(), false);
    if (!bound.isOk()) continue;
    Deadline probe = Deadline::after(0.5);
    if (deadline.expired()) break;
    if (tcp::connectTo(*bound, probe).isOk()) {
      BRAID_INFO("bootstrap interface ", i.name, " ", i.address.toString());
      tcp::SocketAddress chosen = i.address;
      chosen.setPort(0);
      return chosen;
    }
    BRAID_INFO("bootstrap interface ", i.name, " does not accept connections; skipped");
  }
  BRAID_ASSIGN_OR_RETURN(auto loopback, tcp::SocketAddress::parse("127.0.0.1:0"));
  BRAID_INFO("bootstrap interface: loopback (no other interface accepts connections)");
  return loopback;
}

Result<tcp::SocketAddress> startRendezvousServer(const tcp::SocketAddress& listenAt,
                                                 const Secret& secret, double timeoutSeconds,
                                                 double strangerSeconds) {
  BRAID_ASSIGN_OR_RETURN(tcp::Fd listener, tcp::listenOn(listenAt));
  BRAID_ASSIGN_OR_RETURN(tcp::SocketAddress bound,
                         tcp::SocketAddress::ofSocket(listener.get(), false));
  // A server that still waits for ranks when the process exits (a job that
  // never formed) is stopped, and waited for, before libcrypto frees the
  // locks its handshakes use: the handler is registered once, with
  // libcrypto's exit-time cleanup, which runs it before freeing anything
  // (and keeps libbraid loaded for it).
  static const Status hooked =
      beforeCryptoCleanup([] { (void)liveServers().stopAll(Deadline::after(kStopAtExitSeconds)); });
  BRAID_RETURN_IF_ERROR(hooked);
  liveServers().started(bound.toString());
  std::thread([listener = std::move(listener), secret, timeoutSeconds, strangerSeconds,
               address = bound.toString()]() mutable {
    serveRendezvous(std::move(listener), secret, timeoutSeconds, strangerSeconds);
    liveServers().ended(address);
  }).detach();
  return bound;
}

bool awaitRendezvousServers(Deadline deadline) {
  return liveServers().awaitAll(deadline);
}

bool awaitRendezvousServer(const tcp::SocketAddress& at, Deadline deadline) {
  return liveServers().awaitOne(at.toString(), deadline);
}

Result<RendezvousClient> RendezvousClient::connect(const RendezvousInfo& info, int rank,
                                                   Deadline deadline) {
  RendezvousClient client;
  client.rank_ = rank;
  auto connected = tcp::connectTo(
      info.root, deadline,
      info.serverStartsInRankZerosInit ? tcp::WhenRefused::kRetry : tcp::WhenRefused::kFail);
  if (!connected.isOk() && connected.status().code() == ErrorCode::kRemoteError)
    return invalidUsage(strCat(
        "the rendezvous of rank 0 at ", info.root.toString(),
        " has ended: it failed (ranks that disagree on nranks, or two that joined as one rank; "
        "those that joined were told why) or timed out, or this unique id was used for an "
        "earlier communicator (make a new one for each)"));
  BRAID_ASSIGN_OR_RETURN(client.fd_, std::move(connected));
  BRAID_RETURN_IF_ERROR(
      tcp::handshakeConnect(client.fd_.get(), info.secret, kBootstrapPurpose, rank, deadline)
          .withContext(strCat("rendezvous with rank 0 at ", info.root.toString())));
  BRAID_ASSIGN_OR_RETURN(client.local_, tcp::SocketAddress::ofSocket(client.fd_.get(), false));
  return client;
}

Result<std::vector<std::string>> RendezvousClient::exchange(int nranks,
                                                            const std::string& myAddress,
                                                            Deadline deadline) {
  tcp::SocketWire wire(fd_.get(), deadline);
  BRAID_RETURN_IF_ERROR(sendJoinRequest(wire, nranks, myAddress));
  return readRendezvousAnswer(wire, nranks);
}

}  // namespace braid
