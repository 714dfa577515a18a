#include "transports/ib/rdma_stream.h"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "src/common/log.h"
#include "src/common/secret.h"
#include "src/common/strcat.h"

namespace braid::ib {

namespace {

constexpr uint32_t kMagic = 0x4d445242;  // "BRDM"
constexpr uint32_t kCreditFlag = 1u << 31;
constexpr uint32_t kCloseFlag = 1u << 30;
constexpr uint32_t kCountMask = kCloseFlag - 1;
constexpr uint8_t kRnrRetryWithoutEnd = 7;
// Work request ids: 0 for receives, then writes counting from 1, and reads
// with this bit set.
constexpr uint64_t kReadWrId = uint64_t{1} << 63;
constexpr size_t kMaxReadBytes = size_t{1} << 30;

class Writer {
 public:
  template <typename T>
  void put(T v) {
    for (size_t i = 0; i < sizeof(T); ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> bytes;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  template <typename T>
  T get() {
    T v = 0;
    for (size_t i = 0; i < sizeof(T) && at_ < b_.size(); ++i, ++at_)
      v |= static_cast<T>(static_cast<T>(b_[at_]) << (8 * i));
    return v;
  }

 private:
  const std::vector<uint8_t>& b_;
  size_t at_ = 0;
};

bool isPowerOfTwo(size_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

}  // namespace

std::vector<uint8_t> RdmaStreamCard::encode() const {
  Writer w;
  w.put(kMagic);
  w.put(address.qpn);
  w.put(address.psn);
  w.put(address.lid);
  for (uint8_t b : address.gid.raw) w.put(b);
  w.put(static_cast<uint32_t>(address.gidIndex));
  w.put(ringAddr);
  w.put(ringRkey);
  w.put(ringBytes);
  w.put(window);
  w.put(static_cast<uint8_t>(mtu));
  return std::move(w.bytes);
}

Result<RdmaStreamCard> RdmaStreamCard::decode(const std::vector<uint8_t>& bytes) {
  if (bytes.size() != kWireBytes)
    return invalidArgument(strCat("RDMA card of ", bytes.size(), " bytes, not ", kWireBytes));
  Reader r(bytes);
  if (r.get<uint32_t>() != kMagic) return invalidArgument("not an RDMA card (bad magic)");
  RdmaStreamCard c;
  c.address.qpn = r.get<uint32_t>();
  c.address.psn = r.get<uint32_t>();
  c.address.lid = r.get<uint16_t>();
  for (uint8_t& b : c.address.gid.raw) b = r.get<uint8_t>();
  c.address.gidIndex = static_cast<int>(r.get<uint32_t>());
  c.ringAddr = r.get<uint64_t>();
  c.ringRkey = r.get<uint32_t>();
  c.ringBytes = r.get<uint64_t>();
  c.window = r.get<uint32_t>();
  const uint8_t mtu = r.get<uint8_t>();
  if (mtu < static_cast<uint8_t>(Mtu::k256) || mtu > static_cast<uint8_t>(Mtu::k4096))
    return invalidArgument(strCat("RDMA card: MTU code ", int{mtu}, " is not one of verbs'"));
  c.mtu = static_cast<Mtu>(mtu);
  if (c.address.psn > 0xffffff) return invalidArgument("RDMA card: PSN wider than 24 bits");
  if (c.window == 0) return invalidArgument("RDMA card: window 0");
  return c;
}

Status completionError(const Completion& c, int peer, const char* what) {
  const int code = static_cast<int>(c.status);
  const char* hint = "";
  ErrorCode error = ErrorCode::kSystemError;
  switch (c.status) {
    case CompletionStatus::kRetryExceeded:
      hint =
          "the peer did not answer: its process or the link to it is gone (BRAID_IB_TIMEOUT and "
          "BRAID_IB_RETRY_CNT set how long to try)";
      error = ErrorCode::kRemoteError;
      break;
    case CompletionStatus::kRnrRetryExceeded:
      hint = "the peer had no receive posted for the write, for every retry";
      error = ErrorCode::kRemoteError;
      break;
    case CompletionStatus::kRemoteAccessError:
      hint = "the peer refused the access: key or range outside its registration";
      error = ErrorCode::kRemoteError;
      break;
    case CompletionStatus::kRemoteInvalidRequestError:
    case CompletionStatus::kRemoteOperationError:
    case CompletionStatus::kRemoteAbortError:
    case CompletionStatus::kResponseTimeoutError:
      hint = "the peer's side of the queue pair failed";
      error = ErrorCode::kRemoteError;
      break;
    case CompletionStatus::kWorkRequestFlushError:
      hint = "the queue pair had already failed; an earlier completion says why";
      error = ErrorCode::kRemoteError;
      break;
    case CompletionStatus::kLocalProtectionError:
    case CompletionStatus::kLocalAccessError:
    case CompletionStatus::kLocalLengthError:
      hint = "a local buffer was outside its registration";
      break;
    default:
      hint = "the device reported a failure";
      break;
  }
  return Status(error, strCat("RDMA ", what, " with rank ", peer, ": completion status ", code,
                              " (", completionStatusName(c.status), "): ", hint));
}

RdmaStream::RdmaStream(const RdmaStreamOptions& options, int peer)
    : options_(options), peer_(peer) {}

RdmaStream::~RdmaStream() {
  if (readsPosted_ > 0 || (cache_ && cache_->made() > 0))
    BRAID_INFO("RDMA with rank ", peer_, ": ", bytesRead_, " bytes in ", readsPosted_,
               " RDMA reads, ", cache_ ? cache_->made() : 0, " declared buffers registered");
}

Result<std::unique_ptr<RdmaStream>> RdmaStream::connect(Device& device, tcp::Wire& wire,
                                                        const RdmaStreamOptions& options,
                                                        int peer) {
  if (!isPowerOfTwo(options.ringBytes) || options.ringBytes < 4096)
    return invalidArgument(strCat("RDMA ring of ", options.ringBytes,
                                  " bytes: a power of two of at least 4096 is needed"));
  if (options.maxWriteBytes == 0 || options.maxWriteBytes > options.ringBytes ||
      options.maxWriteBytes > kCountMask)
    return invalidArgument(strCat("RDMA writes of at most ", options.maxWriteBytes,
                                  " bytes do not fit a ring of ", options.ringBytes));
  if (options.window == 0 || options.window > (1u << 14))
    return invalidArgument(strCat("RDMA window of ", options.window, " writes"));
  std::unique_ptr<RdmaStream> s(new RdmaStream(options, peer));
  BRAID_ASSIGN_OR_RETURN(PortInfo port, device.queryPort(options.port));
  if (!port.active())
    return Status(ErrorCode::kSystemError,
                  strCat(device.name(), " port ", int{options.port}, " is not active"));
  // Receives: the peer's data writes, its credits for ours (at most one per
  // write of ours in flight) and its end of stream.
  const uint32_t depth = 2 * options.window + 4;
  s->maxSends_ = depth;
  BRAID_ASSIGN_OR_RETURN(s->pd_, device.allocProtectionDomain());
  BRAID_ASSIGN_OR_RETURN(s->cq_, device.createCompletionQueue(static_cast<int>(2 * depth)));
  BRAID_ASSIGN_OR_RETURN(s->qp_, s->pd_->createQueuePair(*s->cq_, *s->cq_, {depth, depth}));
  s->recvRing_.assign(options.ringBytes, 0);
  s->sendRing_.assign(options.ringBytes, 0);
  BRAID_ASSIGN_OR_RETURN(s->recvMr_,
                         s->pd_->registerMemory(s->recvRing_.data(), s->recvRing_.size(),
                                                {.localWrite = true, .remoteWrite = true}));
  BRAID_ASSIGN_OR_RETURN(
      s->sendMr_,
      s->pd_->registerMemory(s->sendRing_.data(), s->sendRing_.size(), {.localWrite = true}));
  if (options.registry) s->cache_ = std::make_unique<RegistrationCache>(*s->pd_, options.registry);
  RdmaStreamCard mine;
  std::array<uint8_t, 3> random{};
  BRAID_RETURN_IF_ERROR(randomBytes(random));
  mine.address.qpn = s->qp_->qpn();
  mine.address.psn = random[0] | (random[1] << 8) | (random[2] << 16);
  mine.address.lid = port.lid;
  if (port.linkLayer == LinkLayer::kEthernet) {
    BRAID_ASSIGN_OR_RETURN(mine.address.gid, device.queryGid(options.port, options.gidIndex));
    mine.address.gidIndex = options.gidIndex;
  }
  mine.ringAddr = reinterpret_cast<uint64_t>(s->recvRing_.data());
  mine.ringRkey = s->recvMr_->rkey();
  mine.ringBytes = options.ringBytes;
  mine.window = options.window;
  mine.mtu = port.activeMtu;
  BRAID_RETURN_IF_ERROR(wire.send(mine.encode()));
  std::vector<uint8_t> theirs(RdmaStreamCard::kWireBytes);
  BRAID_RETURN_IF_ERROR(wire.recv(theirs));
  BRAID_ASSIGN_OR_RETURN(RdmaStreamCard card, RdmaStreamCard::decode(theirs));
  if (card.ringBytes != options.ringBytes)
    return invalidUsage(strCat("rank ", peer, " has RDMA rings of ", card.ringBytes,
                               " bytes, this rank ", options.ringBytes,
                               " (the ranks' settings differ)"));
  s->peerRing_ = {card.ringAddr, card.ringRkey};
  s->peerWindow_ = std::min(options.window, card.window);
  QueuePairAddress remote = card.address;
  // The index is of this side's GID table (QueuePairAddress).
  remote.gidIndex = options.gidIndex;
  // Remote read: the peer copies large messages out of declared buffers,
  // which only their own registrations expose.
  BRAID_RETURN_IF_ERROR(
      s->qp_->toInit(options.port, {.localWrite = true, .remoteWrite = true, .remoteRead = true}));
  for (uint32_t i = 0; i < depth; ++i) BRAID_RETURN_IF_ERROR(s->qp_->postRecv(0));
  BRAID_RETURN_IF_ERROR(s->qp_->toReadyToReceive(remote, std::min(port.activeMtu, card.mtu)));
  BRAID_RETURN_IF_ERROR(s->qp_->toReadyToSend(mine.address.psn, options.timeout, options.retryCount,
                                              kRnrRetryWithoutEnd));
  // Neither end writes before both can receive.
  std::vector<uint8_t> ready{1}, peerReady(1);
  BRAID_RETURN_IF_ERROR(wire.send(ready));
  BRAID_RETURN_IF_ERROR(wire.recv(peerReady));
  return s;
}

// Receives are posted with work request id 0 and sends with ids from 1, so
// a completion is told apart by its id (the only field an error defines).
Status RdmaStream::pump() {
  std::array<Completion, 16> batch;
  for (;;) {
    BRAID_ASSIGN_OR_RETURN(int n, cq_->poll(batch));
    completions_ += n;
    for (int i = 0; i < n; ++i) {
      const Completion& c = batch[i];
      const bool isReceive = c.wrId == 0, isRead = (c.wrId & kReadWrId) != 0;
      if (!c.ok())
        return dead_ = completionError(c, peer_, isReceive ? "receive" : isRead ? "read" : "write");
      if (!isReceive) {
        --sendsOutstanding_;
        if (isRead) ++readsDone_;
        continue;
      }
      if (c.imm & kCreditFlag) {
        for (uint32_t k = c.imm & ~kCreditFlag; k > 0 && !inFlight_.empty(); --k) {
          creditedTail_ += inFlight_.front();
          inFlight_.pop_front();
        }
      } else if (c.imm & kCloseFlag) {
        peerClosed_ = true;
      } else {
        arrived_ += c.imm;
        arrivedSizes_.push_back(c.imm);
      }
      if (Status s = qp_->postRecv(0); !s.isOk()) return dead_ = s;
    }
    if (n < static_cast<int>(batch.size())) return Status::ok();
  }
}

Status RdmaStream::watchPeerSocket(tcp::Fd socket) {
  tcp::Fd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (epoll.get() < 0) return errnoStatus("epoll_create1", errno);
  for (int fd : {cq_->wakeFd(), socket.get()}) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = fd;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &e) != 0)
      return errnoStatus("epoll_ctl", errno);
  }
  socket_ = std::move(socket);
  epoll_ = std::move(epoll);
  return Status::ok();
}

bool RdmaStream::peerSocketClosed() {
  if (socket_.get() < 0) return false;
  char byte;
  // The peer never writes to it after the handshake: readable means closed.
  const ssize_t n = ::recv(socket_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

bool RdmaStream::prepareToSleep(bool) {
  if (!dead_.isOk()) return false;
  cq_->consumeWake();
  if (!cq_->armWake().isOk()) return false;
  // What completed before the queue was armed does not wake it.
  const uint64_t before = completions_;
  if (!pump().isOk()) return false;
  return completions_ == before && arrived_ == tail_ && !peerClosed_ && !peerSocketClosed();
}

Status RdmaStream::postData(uint64_t bytes) {
  const size_t at = head_ & (options_.ringBytes - 1);
  const LocalBuffer local{sendRing_.data() + at, static_cast<uint32_t>(bytes), sendMr_->lkey()};
  const RemoteBuffer remote{peerRing_.addr + at, peerRing_.rkey};
  BRAID_RETURN_IF_ERROR(
      qp_->postWriteWithImm(nextWrId_++, local, remote, static_cast<uint32_t>(bytes), true));
  ++sendsOutstanding_;
  inFlight_.push_back(static_cast<uint32_t>(bytes));
  head_ += bytes;
  return Status::ok();
}

Result<bool> RdmaStream::postControl(uint32_t imm) {
  if (sendsOutstanding_ >= maxSends_) return false;
  BRAID_RETURN_IF_ERROR(qp_->postWriteWithImm(nextWrId_++, LocalBuffer{}, peerRing_, imm, true));
  ++sendsOutstanding_;
  return true;
}

Status RdmaStream::returnCredits(bool force) {
  if (creditsOwed_ == 0) return Status::ok();
  if (!force && creditsOwed_ < std::max<uint32_t>(1, peerWindow_ / 4)) return Status::ok();
  BRAID_ASSIGN_OR_RETURN(bool posted, postControl(kCreditFlag | creditsOwed_));
  if (posted) creditsOwed_ = 0;
  return Status::ok();
}

Result<size_t> RdmaStream::writeSome(const iovec* iov, int count) {
  if (!dead_.isOk()) return dead_;
  if (closed_) return invalidUsage("RDMA stream written after close");
  BRAID_RETURN_IF_ERROR(pump());
  const size_t ring = options_.ringBytes;
  size_t written = 0;
  int index = 0;
  size_t offset = 0;  // into iov[index]
  while (index < count && inFlight_.size() < peerWindow_ && sendsOutstanding_ < maxSends_) {
    const uint64_t room = ring - (head_ - creditedTail_);
    const size_t at = head_ & (ring - 1);
    size_t piece = std::min<uint64_t>({room, options_.maxWriteBytes, ring - at});
    if (piece == 0) break;
    // Gather up to `piece` bytes from the iovecs into the staging ring.
    size_t staged = 0;
    while (staged < piece && index < count) {
      const size_t take = std::min(piece - staged, iov[index].iov_len - offset);
      std::memcpy(sendRing_.data() + at + staged,
                  static_cast<const uint8_t*>(iov[index].iov_base) + offset, take);
      staged += take;
      offset += take;
      if (offset == iov[index].iov_len) ++index, offset = 0;
    }
    if (staged == 0) break;
    if (Status s = postData(staged); !s.isOk()) return dead_ = s;
    written += staged;
  }
  return written;
}

Result<size_t> RdmaStream::readSome(void* into, size_t room) {
  if (!dead_.isOk()) return dead_;
  BRAID_RETURN_IF_ERROR(pump());
  const uint64_t available = arrived_ - tail_;
  if (available == 0) {
    BRAID_RETURN_IF_ERROR(returnCredits(true));
    if (peerClosed_) return remoteError(strCat("rank ", peer_, " closed the RDMA connection"));
    if (peerSocketClosed())
      return dead_ = remoteError(
                 strCat("rank ", peer_, " closed the connection (it exited or aborted)"));
    return size_t{0};
  }
  const size_t ring = options_.ringBytes;
  const size_t n = std::min<uint64_t>(room, available);
  const size_t at = tail_ & (ring - 1);
  const size_t first = std::min(n, ring - at);
  std::memcpy(into, recvRing_.data() + at, first);
  std::memcpy(static_cast<uint8_t*>(into) + first, recvRing_.data(), n - first);
  tail_ += n;
  for (size_t left = n; left > 0;) {
    const uint64_t take = std::min<uint64_t>(left, arrivedSizes_.front() - readOfFront_);
    readOfFront_ += take;
    left -= take;
    if (readOfFront_ == arrivedSizes_.front()) {
      arrivedSizes_.pop_front();
      readOfFront_ = 0;
      ++creditsOwed_;
    }
  }
  BRAID_RETURN_IF_ERROR(returnCredits(arrived_ == tail_));
  return n;
}

std::optional<uint64_t> RdmaStream::peerReadKey(const void* data, size_t bytes) {
  if (!cache_ || !dead_.isOk()) return std::nullopt;
  auto region = cache_->find(data, bytes);
  if (!region.isOk()) {
    // Through the rings instead: slower, never wrong.
    if (!warnedUnregistrable_)
      BRAID_WARN("RDMA with rank ", peer_, ": a declared buffer could not be registered (",
                 region.status().message(), "); its messages go through the rings");
    warnedUnregistrable_ = true;
    return std::nullopt;
  }
  if (*region == nullptr) return std::nullopt;
  return (*region)->rkey();
}

Status RdmaStream::readPeer(void* into, uint64_t address, uint64_t key, size_t bytes) {
  if (!dead_.isOk()) return dead_;
  if (key > UINT32_MAX)
    return dead_ = remoteError(
               strCat("rank ", peer_, " sent a descriptor whose key ", key, " is not an RDMA key"));
  const MemoryRegion* direct = nullptr;
  if (cache_)
    if (auto found = cache_->find(into, bytes); found.isOk()) direct = *found;
  if (!direct && bounce_.empty() && bytes > 0) {
    bounce_.assign(options_.bounceBytes, 0);
    auto mr = pd_->registerMemory(bounce_.data(), bounce_.size(), {.localWrite = true});
    if (!mr.isOk()) {
      bounce_.clear();
      return dead_ = mr.status();
    }
    bounceMr_ = std::move(*mr);
  }
  auto* out = static_cast<uint8_t*>(into);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(bytes - done, direct ? kMaxReadBytes : bounce_.size());
    const LocalBuffer local =
        direct ? LocalBuffer{out + done, static_cast<uint32_t>(n), direct->lkey()}
               : LocalBuffer{bounce_.data(), static_cast<uint32_t>(n), bounceMr_->lkey()};
    while (sendsOutstanding_ >= maxSends_) BRAID_RETURN_IF_ERROR(pump());
    if (Status s = qp_->postRead(kReadWrId | ++readsPosted_, local,
                                 {address + done, static_cast<uint32_t>(key)}, true);
        !s.isOk())
      return dead_ = s;
    ++sendsOutstanding_;
    // The queue pair delivers the read or fails it (retries run out), so
    // this wait ends; what else completes meanwhile is taken in as usual.
    while (readsDone_ < readsPosted_) BRAID_RETURN_IF_ERROR(pump());
    if (!direct) std::memcpy(out + done, bounce_.data(), n);
    done += n;
    bytesRead_ += n;
  }
  return Status::ok();
}

void RdmaStream::writeLast(const iovec* iov, int count) {
  if (!dead_.isOk() || closed_ || !pump().isOk()) return;
  size_t wanted = 0;
  for (int i = 0; i < count; ++i) wanted += iov[i].iov_len;
  const size_t ring = options_.ringBytes;
  const uint64_t room = ring - (head_ - creditedTail_);
  const uint64_t pieces = (wanted + options_.maxWriteBytes - 1) / options_.maxWriteBytes + 1;
  if (wanted > room || inFlight_.size() + pieces > peerWindow_ ||
      sendsOutstanding_ + pieces > maxSends_)
    return;
  (void)writeSome(iov, count);
}

void RdmaStream::close() {
  if (closed_) return;
  closed_ = true;
  if (dead_.isOk()) (void)postControl(kCloseFlag);
}

}  // namespace braid::ib
