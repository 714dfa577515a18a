// The single-copy protocol across processes: negotiation, copies both ways, a killed peer.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/common/strcat.h"
#include "tests/unit/stream_connection_fixtures.h"
#include "transports/shm/host_allocations.h"
#include "transports/shm/shm_stream.h"
#include "transports/stream_connection.h"
#include "transports/tcp/socket_stream.h"

namespace braid::transport {
namespace {

// Progresses one end until no request is pending, sleeping on its fd as the
// engine does; false after `seconds`.
bool runUntilDone(StreamConnection& c, const std::vector<RequestPtr>& requests,
                  double seconds = 10) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    bool pending = false;
    for (const auto& r : requests) pending = pending || r->state() == Request::State::kPending;
    if (!pending) return true;
    auto moved = c.progress();
    if (moved.isOk() && *moved) continue;
    if (c.prepareToSleep()) {
      pollfd fd{c.pollFd(), POLLIN, 0};
      (void)::poll(&fd, 1, 10);
    }
  }
  return false;
}

TEST_F(SingleCopy, NegotiationAgreesOnlyWhenBothEndsCanRead) {
  for (bool aWilling : {true, false}) {
    SCOPED_TRACE(aWilling ? "both willing" : "one end turned it off");
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    tcp::Fd fa(fds[0]), fb(fds[1]);
    Result<shm::ReadPeerVerdict> va = internalError("not run"), vb = internalError("not run");
    std::thread t([&] { vb = shm::negotiateReadPeer(fb.get(), true, Deadline::after(10)); });
    va = shm::negotiateReadPeer(fa.get(), aWilling, Deadline::after(10));
    t.join();
    ASSERT_TRUE(va.isOk()) << va.status().message();
    ASSERT_TRUE(vb.isOk()) << vb.status().message();
    EXPECT_EQ(va->peerPid, aWilling ? ::getpid() : 0);
    EXPECT_EQ(vb->peerPid, aWilling ? ::getpid() : 0);
    if (!aWilling) {
      EXPECT_NE(va->refused.find("turned off on this rank"), std::string::npos) << va->refused;
      EXPECT_NE(vb->refused.find("turned off on the peer"), std::string::npos) << vb->refused;
    }
  }
}

// A peer whose word cannot be read (here: a bad address, as when the kernel
// refuses) leaves both ends on the rings.
TEST_F(SingleCopy, NegotiationFailsWhenTheWordCannotBeRead) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  tcp::Fd fa(fds[0]), fb(fds[1]);
  std::thread fake([&] {
    // The offer's wire format: willing, pid, address, value.
    const uint64_t offer[4] = {1, static_cast<uint64_t>(::getpid()), 0, 42};
    uint64_t theirs[4];
    uint8_t canRead = 1, peerCanRead = 0;
    const Deadline d = Deadline::after(10);
    (void)tcp::sendAll(fb.get(), {reinterpret_cast<const uint8_t*>(offer), sizeof(offer)}, d);
    (void)tcp::recvAll(fb.get(), {reinterpret_cast<uint8_t*>(theirs), sizeof(theirs)}, d);
    (void)tcp::sendAll(fb.get(), {&canRead, 1}, d);
    (void)tcp::recvAll(fb.get(), {&peerCanRead, 1}, d);
  });
  auto verdict = shm::negotiateReadPeer(fa.get(), true, Deadline::after(10));
  fake.join();
  ASSERT_TRUE(verdict.isOk()) << verdict.status().message();
  EXPECT_EQ(verdict->peerPid, 0);
  EXPECT_NE(verdict->refused.find("process_vm_readv"), std::string::npos) << verdict->refused;
}

std::unique_ptr<StreamConnection> connectShm(shm::Segment segment, bool creator, int fd, int peer,
                                             pid_t peerPid) {
  auto stream =
      std::make_unique<shm::ShmStream>(std::move(segment), kRingBytes, creator, tcp::Fd(fd), peer);
  if (peerPid > 0) stream->enableReadPeer(peerPid);
  return std::make_unique<StreamConnection>(std::move(stream), peer, patient());
}

// What two processes share before fork(): a socket pair and the segment of
// their rings. The parent keeps `segment` and fds[0]; the child opens the
// segment by name (openedInChild) and keeps fds[1].
struct SharedRings {
  int fds[2] = {-1, -1};
  shm::Segment segment;
  std::string name;
};

Result<SharedRings> makeSharedRings() {
  SharedRings rings;
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, rings.fds) != 0)
    return errnoStatus("socketpair", errno);
  BRAID_ASSIGN_OR_RETURN(rings.segment, shm::Segment::create(shm::segmentBytes(kRingBytes)));
  shm::ShmStream::initialize(rings.segment, kRingBytes);
  rings.name = rings.segment.name();
  return rings;
}

// In the child after fork(): the parent's socket closed and the segment
// mapped; exits with 10 when it cannot be.
shm::Segment openedInChild(const SharedRings& rings) {
  ::close(rings.fds[0]);
  auto opened = shm::Segment::open(rings.name, shm::segmentBytes(kRingBytes));
  if (!opened.isOk()) _exit(10);
  return std::move(*opened);
}

// Ranks that one launcher started are siblings. Where Yama's ptrace_scope is
// 1 (Ubuntu's default) a process may read only its descendants' memory and
// that of processes that named it, or one of its ancestors, their ptracer;
// siblings then agree on single copy only because negotiation names the
// parent. Each child reports its verdict through its exit code and, when
// refused, the reason through a pipe. On a kernel without Yama the siblings
// always agree; tools/ptrace-scope-vm.sh runs this under ptrace_scope 1.
TEST_F(SingleCopy, SiblingProcessesAgreeToReadEachOther) {
  int fds[2], reasons[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  ASSERT_EQ(pipe(reasons), 0);
  pid_t children[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    children[i] = fork();
    if (children[i] == 0) {
      ::close(fds[1 - i]);
      ::close(reasons[0]);
      auto verdict = shm::negotiateReadPeer(fds[i], true, Deadline::after(10));
      if (!verdict.isOk()) _exit(11);
      if (verdict->peerPid == 0) {
        const std::string why = strCat("child ", i, ": ", verdict->refused, "\n");
        (void)!::write(reasons[1], why.data(), why.size());
        _exit(12);
      }
      // The peer is this process's sibling: a child of the same parent, not the parent.
      _exit(verdict->peerPid != ::getppid() && verdict->peerPid != ::getpid() ? 0 : 13);
    }
    ASSERT_GT(children[i], 0);
  }
  ::close(fds[0]);
  ::close(fds[1]);
  ::close(reasons[1]);
  std::string why;
  char buffer[512];
  for (ssize_t n; (n = ::read(reasons[0], buffer, sizeof(buffer))) > 0;) why.append(buffer, n);
  ::close(reasons[0]);
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << why;
  }
}

// Two processes that probe each other, then exchange large messages both
// ways, one of them reduced, each copied once from the other's memory.
TEST_F(SingleCopy, CopiesAcrossProcesses) {
  auto rings = makeSharedRings();
  ASSERT_TRUE(rings.isOk()) << rings.status().message();
  const int* fds = rings->fds;
  const size_t bytes = (16 << 20) + 4;
  pid_t child = fork();
  if (child == 0) {
    shm::Segment opened = openedInChild(*rings);
    auto verdict = shm::negotiateReadPeer(fds[1], true, Deadline::after(10));
    if (!verdict.isOk()) _exit(11);
    if (verdict->peerPid == 0) _exit(77);  // not permitted here
    if (verdict->peerPid != ::getppid()) _exit(12);
    auto b = connectShm(std::move(opened), false, fds[1], 0, verdict->peerPid);
    std::vector<uint8_t> got(bytes), local = pattern(bytes, 21), sum(bytes);
    std::vector<uint8_t> reply = pattern(bytes, 22);
    Adder adder;
    adder.unit = 4;
    adder.dst = sum.data();
    std::vector<RequestPtr> requests = {
        b->postRecv(got.data(), bytes, tag(1)),
        b->postRecvReduce(sum.data(), local.data(), bytes, tag(2), {4, &Adder::apply, &adder}),
        b->postSend(reply.data(), bytes, tag(1))};
    if (!runUntilDone(*b, requests)) _exit(13);
    for (const auto& r : requests)
      if (r->state() != Request::State::kDone) _exit(14);
    if (got != pattern(bytes, 20)) _exit(15);
    std::vector<uint8_t> incoming = pattern(bytes, 23);
    for (size_t i = 0; i < bytes; ++i)
      if (sum[i] != static_cast<uint8_t>(local[i] + incoming[i])) _exit(16);
    _exit(0);
  }
  ASSERT_GT(child, 0);
  ::close(fds[1]);
  auto verdict = shm::negotiateReadPeer(fds[0], true, Deadline::after(10));
  rings->segment.unlink();
  ASSERT_TRUE(verdict.isOk()) << verdict.status().message();
  if (verdict->peerPid == 0) {
    int status = 0;
    waitpid(child, &status, 0);
    GTEST_SKIP() << "the processes may not read each other: " << verdict->refused;
  }
  EXPECT_EQ(verdict->peerPid, child);
  auto a = connectShm(std::move(rings->segment), true, fds[0], 1, verdict->peerPid);
  std::vector<uint8_t> out = pattern(bytes, 20), reduced = pattern(bytes, 23), back(bytes);
  std::vector<RequestPtr> requests = {a->postSend(out.data(), bytes, tag(1)),
                                      a->postSend(reduced.data(), bytes, tag(2)),
                                      a->postRecv(back.data(), bytes, tag(1))};
  EXPECT_TRUE(runUntilDone(*a, requests));
  for (const auto& r : requests) EXPECT_EQ(r->state(), Request::State::kDone);
  EXPECT_EQ(back, pattern(bytes, 22));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's checks (see its exit codes)";
}

// A receiver that dies holding a descriptor fails the send waiting for its ack.
TEST_F(SingleCopy, KilledReceiverFailsASendWaitingForItsAck) {
  auto rings = makeSharedRings();
  ASSERT_TRUE(rings.isOk()) << rings.status().message();
  const int* fds = rings->fds;
  pid_t child = fork();
  if (child == 0) {
    shm::Segment opened = openedInChild(*rings);
    auto b = connectShm(std::move(opened), false, fds[1], 0, ::getppid());
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!b->unclaimed(0, 2) && std::chrono::steady_clock::now() < until) (void)b->progress();
    _exit(b->unclaimed(0, 2) ? 0 : 11);  // dies holding the descriptor, saying nothing
  }
  ASSERT_GT(child, 0);
  ::close(fds[1]);
  auto a = connectShm(std::move(rings->segment), true, fds[0], 1, child);
  std::vector<uint8_t> big = pattern(1 << 20, 30);
  RequestPtr s = a->postSend(big.data(), big.size(), tag(1));
  EXPECT_TRUE(runUntilDone(*a, {s}));
  ASSERT_EQ(s->state(), Request::State::kFailed);
  EXPECT_EQ(s->error().code(), ErrorCode::kRemoteError);
  EXPECT_NE(s->error().message().find("rank 1"), std::string::npos) << s->error().message();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child saw the descriptor before it died";
}

// A sender that died after its descriptor went out fails the receive.
TEST_F(SingleCopy, KilledSenderFailsTheReceiveBeingCopied) {
  auto rings = makeSharedRings();
  ASSERT_TRUE(rings.isOk()) << rings.status().message();
  const int* fds = rings->fds;
  pid_t child = fork();
  if (child == 0) {
    shm::Segment opened = openedInChild(*rings);
    auto b = connectShm(std::move(opened), false, fds[1], 0, ::getppid());
    std::vector<uint8_t> big = pattern(64 << 20, 31);
    RequestPtr s = b->postSend(big.data(), big.size(), tag(1));
    for (int i = 0; i < 20; ++i) (void)b->progress();  // the descriptor is out
    _exit(s->state() == Request::State::kPending ? 0 : 11);
  }
  ASSERT_GT(child, 0);
  ::close(fds[1]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's descriptor went out";
  auto a = connectShm(std::move(rings->segment), true, fds[0], 1, child);
  std::vector<uint8_t> got(64 << 20);
  RequestPtr r = a->postRecv(got.data(), got.size(), tag(1));
  EXPECT_TRUE(runUntilDone(*a, {r}));
  ASSERT_EQ(r->state(), Request::State::kFailed);
  EXPECT_EQ(r->error().code(), ErrorCode::kRemoteError);
  EXPECT_NE(r->error().message().find("rank 1"), std::string::npos) << r->error().message();
}

// How many mappings of braidHostAlloc memory this process has.
int sharedAllocationMappings() {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);)
    count += line.find("memfd:braid-host-alloc") != std::string::npos;
  return count;
}

// A sender whose payloads are braidHostAlloc memory: the receiver maps the
// allocation and copies from it (and reduces straight from it), so the
// bytes arrive exact and this process, which allocated nothing shared,
// holds a mapping of the sender's memory afterwards.
TEST_F(SingleCopy, ReadsAndReducesBraidHostAllocMemoryThroughAMapping) {
  auto rings = makeSharedRings();
  ASSERT_TRUE(rings.isOk()) << rings.status().message();
  const int* fds = rings->fds;
  const size_t bytes = (8 << 20) + 4;
  pid_t child = fork();
  if (child == 0) {
    shm::Segment opened = openedInChild(*rings);
    auto b = connectShm(std::move(opened), false, fds[1], 0, ::getppid());
    auto plain = shm::allocateShared(bytes), reduced = shm::allocateShared(bytes);
    if (!plain.isOk() || !reduced.isOk()) _exit(11);
    std::memcpy(*plain, pattern(bytes, 40).data(), bytes);
    std::memcpy(*reduced, pattern(bytes, 41).data(), bytes);
    std::vector<RequestPtr> requests = {b->postSend(*plain, bytes, tag(1)),
                                        b->postSend(*reduced, bytes, tag(2))};
    if (!runUntilDone(*b, requests)) _exit(12);
    for (const auto& r : requests)
      if (r->state() != Request::State::kDone) _exit(13);
    _exit(0);
  }
  ASSERT_GT(child, 0);
  ::close(fds[1]);
  const int mappedBefore = sharedAllocationMappings();
  auto a = connectShm(std::move(rings->segment), true, fds[0], 1, child);
  std::vector<uint8_t> got(bytes), local = pattern(bytes, 42), sum(bytes);
  Adder adder;
  adder.unit = 4;
  adder.dst = sum.data();
  std::vector<RequestPtr> requests = {
      a->postRecv(got.data(), bytes, tag(1)),
      a->postRecvReduce(sum.data(), local.data(), bytes, tag(2), {4, &Adder::apply, &adder})};
  EXPECT_TRUE(runUntilDone(*a, requests));
  for (const auto& r : requests)
    EXPECT_EQ(r->state(), Request::State::kDone) << (r->error().isOk() ? "" : r->error().message());
  EXPECT_EQ(got, pattern(bytes, 40));
  const std::vector<uint8_t> incoming = pattern(bytes, 41);
  for (size_t i = 0; i < bytes; ++i)
    if (sum[i] != static_cast<uint8_t>(local[i] + incoming[i])) {
      ADD_FAILURE() << "sum differs at byte " << i;
      break;
    }
  EXPECT_FALSE(adder.split);
  EXPECT_EQ(adder.units, bytes / 4);
  EXPECT_EQ(sharedAllocationMappings() - mappedBefore, 2) << "both payloads were mapped";
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's checks (see its exit codes)";
}

}  // namespace
}  // namespace braid::transport
