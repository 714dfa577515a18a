#include "transports/shm/shm_stream.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <new>
#include <optional>

#include "src/common/log.h"
#include "src/common/secret.h"
#include "src/common/strcat.h"
#include "transports/completion_signal.h"
#include "transports/tcp/socket.h"

namespace braid::shm {

namespace {
constexpr size_t kControlBytes = 4096;  // keeps each ring's data page aligned
static_assert(sizeof(RingControl) <= kControlBytes);

// Offsets of ring i's control block and data in the segment.
size_t controlOffset(int i) {
  return static_cast<size_t>(i) * kControlBytes;
}
size_t dataOffset(int i, size_t ringBytes) {
  return 2 * kControlBytes + static_cast<size_t>(i) * ringBytes;
}

enum class Direction { kRead, kWrite };

// Copies `bytes` between `local` here and `address` in process `pid`, in
// `direction` (read: from the process); 0 or an errno value.
int copyProcess(pid_t pid, Direction direction, void* local, uint64_t address, size_t bytes) {
  auto* at = static_cast<uint8_t*>(local);
  while (bytes > 0) {
    iovec here{at, bytes};
    iovec there{reinterpret_cast<void*>(address), bytes};
    const ssize_t moved = direction == Direction::kRead
                              ? ::process_vm_readv(pid, &here, 1, &there, 1, 0)
                              : ::process_vm_writev(pid, &here, 1, &there, 1, 0);
    if (moved < 0 && errno == EINTR) continue;
    if (moved < 0) return errno;
    // A short count means the rest of the range is not mapped.
    if (moved == 0) return EFAULT;
    at += moved;
    address += static_cast<uint64_t>(moved);
    bytes -= static_cast<size_t>(moved);
  }
  return 0;
}

int readProcess(pid_t pid, void* into, uint64_t address, size_t bytes) {
  return copyProcess(pid, Direction::kRead, into, address, bytes);
}

// Yama's kernel.yama.ptrace_scope, or nothing where the kernel has no Yama.
// Read once per process: negotiation asks for every pair.
std::optional<int> yamaPtraceScope() {
  static const std::optional<int> scope = []() -> std::optional<int> {
    std::ifstream file("/proc/sys/kernel/yama/ptrace_scope");
    int value = 0;
    if (!(file >> value)) return std::nullopt;
    return value;
  }();
  return scope;
}

// Under ptrace_scope 1 a process may read the memory of its descendants and
// of the processes that named it, or one of its ancestors, their ptracer;
// ranks that one launcher started are siblings and may not read each other.
// Naming the parent lets exactly the launcher's descendants in (Open MPI
// names any process instead). A process has one such name, so this replaces
// one the program may have set; it is left alone where the scope is not 1,
// as nothing needs it there (0) or it would not help (2, 3).
void letTheParentsDescendantsRead() {
  if (yamaPtraceScope() != 1) return;
  // A failure leaves the pair on the rings, and negotiation says why.
  (void)::prctl(PR_SET_PTRACER, static_cast<unsigned long>(::getppid()), 0, 0, 0);
}

// Why the kernel refused this process a read of another's memory (EPERM).
std::string whyPtraceRulesForbid() {
  const std::optional<int> scope = yamaPtraceScope();
  if (!scope || *scope == 0)
    return "a container's seccomp profile or a missing CAP_SYS_PTRACE forbids it";
  if (*scope == 1)
    return strCat("kernel.yama.ptrace_scope is 1 and the peer was not started by a process this ",
                  "rank descends from (each rank lets its parent's descendants in)");
  if (*scope == 2) return "kernel.yama.ptrace_scope is 2: only processes with CAP_SYS_PTRACE may";
  return strCat("kernel.yama.ptrace_scope is ", *scope, ": no process may");
}
}  // namespace

size_t segmentBytes(size_t ringBytes) {
  return 2 * kControlBytes + 2 * ringBytes;
}

size_t fittedRingBytes(size_t preferred, size_t freeBytes, int ranksOnHost) {
  if (ranksOnHost < 2) return preferred;  // no pair: nothing to fit
  const size_t pairs = static_cast<size_t>(ranksOnHost) * (ranksOnHost - 1) / 2;
  size_t ring = preferred;
  while (ring > kMinRingBytes && segmentBytes(ring) > freeBytes / 2 / pairs) ring /= 2;
  return ring;
}

void ShmStream::initialize(Segment& segment, size_t ringBytes) {
  auto* base = static_cast<uint8_t*>(segment.base());
  for (int i = 0; i < 2; ++i) {
    auto* control = new (base + controlOffset(i)) RingControl;
    control->head.store(0);
    control->tail.store(0);
    control->consumerSleeping.store(0);
    control->producerSleeping.store(0);
    control->closed.store(0);
    control->writingIntoConsumer.store(0);
  }
  (void)ringBytes;
}

ShmStream::ShmStream(Segment segment, size_t ringBytes, bool creator, tcp::Fd doorbell, int peer)
    : segment_(std::move(segment)),
      ringBytes_(ringBytes),
      doorbell_(std::move(doorbell)),
      peer_(peer) {
  auto* base = static_cast<uint8_t*>(segment_.base());
  const int outIndex = creator ? 0 : 1, inIndex = 1 - outIndex;
  out_ = {reinterpret_cast<RingControl*>(base + controlOffset(outIndex)),
          base + dataOffset(outIndex, ringBytes)};
  in_ = {reinterpret_cast<RingControl*>(base + controlOffset(inIndex)),
         base + dataOffset(inIndex, ringBytes)};
}

Status ShmStream::closedByPeer() const {
  return remoteError(strCat("rank ", peer_, " closed the connection (it exited or aborted)"));
}

void ShmStream::ring(std::atomic<uint32_t>& sleeping) {
  // The flag's store and our publication are ordered by seq_cst on both
  // sides (Dekker): either the sleeper sees our bytes before it sleeps, or
  // we see its flag here.
  if (sleeping.load(std::memory_order_seq_cst) == 0) return;
  if (sleeping.exchange(0, std::memory_order_seq_cst) == 0) return;
  const char bell = 1;
  // A full socket buffer already holds wake-ups enough.
  (void)::send(doorbell_.get(), &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

size_t ShmStream::copyIn(const iovec* iov, int count, size_t limit) {
  size_t copied = 0;
  for (int i = 0; i < count && copied < limit; ++i) {
    const auto* from = static_cast<const uint8_t*>(iov[i].iov_base);
    size_t left = std::min(iov[i].iov_len, limit - copied);
    while (left > 0) {
      const size_t at = (outHead_ + copied) & (ringBytes_ - 1);
      const size_t take = std::min(left, ringBytes_ - at);
      std::memcpy(out_.data + at, from, take);
      from += take;
      left -= take;
      copied += take;
    }
  }
  return copied;
}

Result<size_t> ShmStream::writeSome(const iovec* iov, int count) {
  if (closed_) return closedByPeer();
  size_t wanted = 0;
  for (int i = 0; i < count; ++i) wanted += iov[i].iov_len;
  size_t room = ringBytes_ - (outHead_ - outTailSeen_);
  if (room < wanted) {
    outTailSeen_ = out_.control->tail.load(std::memory_order_acquire);
    room = ringBytes_ - (outHead_ - outTailSeen_);
  }
  if (room == 0) {
    if (peerGone_) return closedByPeer();
    return size_t{0};
  }
  const size_t copied = copyIn(iov, count, std::min(room, wanted));
  outHead_ += copied;
  out_.control->head.store(outHead_, std::memory_order_seq_cst);
  ring(out_.control->consumerSleeping);
  return copied;
}

Status ShmStream::drainDoorbell() {
  char bells[64];
  while (true) {
    ssize_t got = ::recv(doorbell_.get(), bells, sizeof(bells), MSG_DONTWAIT);
    if (got > 0) {
      // Maybe rung for another thread of this process asleep on this
      // connection (another braid stream's), whose poll no longer sees the
      // bell: the sleepers look again. The caller is none of them.
      transport::CompletionSignal::notify();
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::ok();
    peerGone_ = true;  // end of stream or reset: the peer's process is gone
    return Status::ok();
  }
}

Result<size_t> ShmStream::readSome(void* into, size_t room) {
  if (closed_) return closedByPeer();
  if (slept_) {
    slept_ = false;
    BRAID_RETURN_IF_ERROR(drainDoorbell());
  }
  // closed before head: a producer sets closed after its last bytes.
  const bool finished = in_.control->closed.load(std::memory_order_acquire) != 0;
  const uint64_t head = in_.control->head.load(std::memory_order_acquire);
  const size_t available = head - inTail_;
  if (available == 0) {
    if (finished || peerGone_) return closedByPeer();
    return size_t{0};
  }
  const size_t take = std::min(available, room);
  auto* to = static_cast<uint8_t*>(into);
  size_t done = 0;
  while (done < take) {
    const size_t at = (inTail_ + done) & (ringBytes_ - 1);
    const size_t piece = std::min(take - done, ringBytes_ - at);
    std::memcpy(to + done, in_.data + at, piece);
    done += piece;
  }
  inTail_ += take;
  in_.control->tail.store(inTail_, std::memory_order_seq_cst);
  ring(in_.control->producerSleeping);
  return take;
}

bool ShmStream::prepareToSleep(bool sendsPending) {
  slept_ = true;
  in_.control->consumerSleeping.store(1, std::memory_order_seq_cst);
  if (sendsPending) out_.control->producerSleeping.store(1, std::memory_order_seq_cst);
  if (in_.control->head.load(std::memory_order_seq_cst) != inTail_) return false;
  if (in_.control->closed.load(std::memory_order_seq_cst) != 0) return false;
  if (sendsPending && out_.control->tail.load(std::memory_order_seq_cst) != outTailSeen_)
    return false;
  return true;
}

void ShmStream::writeLast(const iovec* iov, int count) {
  if (closed_) return;
  size_t wanted = 0;
  for (int i = 0; i < count; ++i) wanted += iov[i].iov_len;
  outTailSeen_ = out_.control->tail.load(std::memory_order_acquire);
  if (ringBytes_ - (outHead_ - outTailSeen_) < wanted) return;
  outHead_ += copyIn(iov, count, wanted);
  out_.control->head.store(outHead_, std::memory_order_seq_cst);
}

std::optional<uint64_t> ShmStream::peerReadKey(const void* data, size_t bytes) {
  if (!canReadPeer()) return std::nullopt;
  return sharedKey(data, bytes).value_or(0);
}

Result<const std::byte*> ShmStream::peerBytesInPlace(uint64_t address, uint64_t key, size_t bytes) {
  if (peerPid_ <= 0 || !isSharedKey(key)) return static_cast<const std::byte*>(nullptr);
  return peerAllocations_.find(address, key, bytes);
}

Status ShmStream::readPeer(void* into, uint64_t address, uint64_t key, size_t bytes) {
  if (peerPid_ <= 0) return notSupported("this stream cannot read the peer's memory");
  if (isSharedKey(key)) {
    BRAID_ASSIGN_OR_RETURN(const std::byte* from, peerAllocations_.find(address, key, bytes));
    std::memcpy(into, from, bytes);
    return Status::ok();
  }
  const int err = readProcess(peerPid_, into, address, bytes);
  if (err == 0) return Status::ok();
  if (err == ESRCH) return closedByPeer();
  return errnoStatus(
      strCat("reading ", bytes, " bytes of rank ", peer_, "'s memory (process ", peerPid_, ")"),
      err);
}

Status ShmStream::writePeer(uint64_t address, uint64_t key, const void* from, size_t bytes) {
  if (peerPid_ <= 0) return notSupported("this stream cannot write the peer's memory");
  // Announced, then the peer's close checked, both sequentially consistent
  // as the peer's close and its read of this flag are (close()): either
  // this write sees the close and writes nothing, or the close waits for it.
  out_.control->writingIntoConsumer.store(1, std::memory_order_seq_cst);
  struct Lowered {
    RingControl* control;
    ~Lowered() { control->writingIntoConsumer.store(0, std::memory_order_release); }
  } lowered{out_.control};
  if (in_.control->closed.load(std::memory_order_seq_cst) != 0) return closedByPeer();
  if (isSharedKey(key)) {
    BRAID_ASSIGN_OR_RETURN(std::byte * to, peerAllocations_.findWritable(address, key, bytes));
    std::memcpy(to, from, bytes);
    return Status::ok();
  }
  // process_vm_writev only reads the local iovec.
  const int err = copyProcess(peerPid_, Direction::kWrite, const_cast<void*>(from), address, bytes);
  if (err == 0) return Status::ok();
  if (err == ESRCH) return closedByPeer();
  return errnoStatus(
      strCat("writing ", bytes, " bytes into rank ", peer_, "'s memory (process ", peerPid_, ")"),
      err);
}

void ShmStream::close() {
  if (closed_) return;
  closed_ = true;
  out_.control->closed.store(1, std::memory_order_seq_cst);
  // Wakes a sleeping peer for certain, sleeping flag or not.
  ::shutdown(doorbell_.get(), SHUT_RDWR);
  // A write into this process that the peer began before it could see the
  // close ends before the caller, told the connection failed, takes its
  // receive buffers back: one copy of at most a message, or the peer is
  // gone. A peer stopped in the middle of one (SIGSTOP) is not waited for
  // past the grace.
  constexpr auto kGrace = std::chrono::seconds(2);
  const auto start = std::chrono::steady_clock::now();
  while (in_.control->writingIntoConsumer.load(std::memory_order_seq_cst) != 0) {
    if (peerPid_ > 0 && ::kill(peerPid_, 0) != 0 && errno == ESRCH) return;
    if (std::chrono::steady_clock::now() - start > kGrace) {
      BRAID_WARN("rank ", peer_, " is still writing into this rank's memory ",
                 std::chrono::duration_cast<std::chrono::seconds>(kGrace).count(),
                 " s after the connection closed; a receive buffer of the failed call may "
                 "still change");
      return;
    }
    ::usleep(20);
  }
}

Result<ReadPeerVerdict> negotiateReadPeer(int fd, bool willing, Deadline deadline) {
  struct Offer {
    uint64_t willing, pid, address, value;
  };
  // Before the offer goes out: the peer reads this process once it has it.
  if (willing) letTheParentsDescendantsRead();
  uint64_t random = 0;
  BRAID_RETURN_IF_ERROR(randomBytes({reinterpret_cast<uint8_t*>(&random), sizeof(random)}));
  // volatile: the peer reads it from this process's memory, unseen by the compiler.
  volatile uint64_t word = random;
  const Offer mine{willing ? 1u : 0u, static_cast<uint64_t>(::getpid()),
                   reinterpret_cast<uintptr_t>(&word), random};
  Offer theirs{};
  BRAID_RETURN_IF_ERROR(
      tcp::sendAll(fd, {reinterpret_cast<const uint8_t*>(&mine), sizeof(mine)}, deadline));
  BRAID_RETURN_IF_ERROR(
      tcp::recvAll(fd, {reinterpret_cast<uint8_t*>(&theirs), sizeof(theirs)}, deadline));
  ReadPeerVerdict verdict;
  uint8_t canRead = 0;
  const auto pid = static_cast<pid_t>(theirs.pid);
  if (!willing) {
    verdict.refused = "turned off on this rank";
  } else if (theirs.willing != 1) {
    verdict.refused = "turned off on the peer";
  } else if (pid <= 0 || static_cast<uint64_t>(pid) != theirs.pid) {
    verdict.refused = strCat("the peer sent an impossible pid ", theirs.pid);
  } else {
    uint64_t got = 0;
    if (int err = readProcess(pid, &got, theirs.address, sizeof(got)); err != 0) {
      verdict.refused = errnoStatus(strCat("process_vm_readv of process ", pid), err).message();
      if (err == EPERM) verdict.refused += strCat(" (", whyPtraceRulesForbid(), ")");
      if (err == ENOSYS) verdict.refused += " (a container's seccomp profile forbids it)";
    } else if (got != theirs.value) {
      verdict.refused =
          strCat("process ", pid, " is not the peer seen from here (another pid namespace?)");
    } else {
      canRead = 1;
    }
  }
  // The peer's answer also means it is done reading `word`.
  uint8_t peerCanRead = 0;
  BRAID_RETURN_IF_ERROR(tcp::sendAll(fd, {&canRead, 1}, deadline));
  BRAID_RETURN_IF_ERROR(tcp::recvAll(fd, {&peerCanRead, 1}, deadline));
  if (canRead && peerCanRead != 1) verdict.refused = "the peer cannot read this rank's memory";
  if (canRead && peerCanRead == 1) verdict.peerPid = pid;
  return verdict;
}

}  // namespace braid::shm
