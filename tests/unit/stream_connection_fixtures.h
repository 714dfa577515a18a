// Fixtures shared by the stream connection tests (one executable): defined once, inline.
#pragma once

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "transports/shm/shm_stream.h"
#include "transports/stream_connection.h"
#include "transports/tcp/socket_stream.h"

namespace braid::transport {

inline constexpr size_t kRingBytes = 64 << 10;  // small, so large messages wrap many times

// Whether this process may read its own memory with process_vm_readv (a
// seccomp profile can forbid the call outright).
inline bool selfReadable() {
  static const bool readable = [] {
    uint64_t word = 42, got = 0;
    iovec local{&got, sizeof(got)}, remote{&word, sizeof(word)};
    return ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) == sizeof(got) && got == 42;
  }();
  return readable;
}

// Forwards to a real stream, counting what readPeer() and writePeer() copy;
// it can also refuse them, as a peer that vanished or a kernel that forbids
// them would.
class TestStream final : public ByteStream {
 public:
  explicit TestStream(std::unique_ptr<ByteStream> inner) : inner_(std::move(inner)) {}
  Result<size_t> writeSome(const iovec* iov, int count) override {
    return inner_->writeSome(iov, count);
  }
  Result<size_t> readSome(void* into, size_t room) override { return inner_->readSome(into, room); }
  void writeLast(const iovec* iov, int count) override { inner_->writeLast(iov, count); }
  void close() override { inner_->close(); }
  int pollFd() const override { return inner_->pollFd(); }
  bool pollForWrite(bool sendsPending) const override { return inner_->pollForWrite(sendsPending); }
  bool prepareToSleep(bool sendsPending) override { return inner_->prepareToSleep(sendsPending); }
  bool canReadPeer() const override { return inner_->canReadPeer(); }
  std::optional<uint64_t> peerReadKey(const void* data, size_t bytes) override {
    if (refuseKeys) return std::nullopt;
    const auto key = inner_->peerReadKey(data, bytes);
    return key ? std::optional<uint64_t>(*key + keyOffset) : std::nullopt;
  }
  Status readPeer(void* into, uint64_t address, uint64_t key, size_t bytes) override {
    if (failReads) return errnoStatus("process_vm_readv", EPERM);
    ++reads;
    bytesRead += bytes;
    keysSeen.push_back(key);
    return inner_->readPeer(into, address, key - keyOffset, bytes);
  }

  Result<const std::byte*> peerBytesInPlace(uint64_t address, uint64_t key, size_t bytes) override {
    if (failReads) return errnoStatus("mapping the peer's memory", EPERM);
    auto inPlace = inner_->peerBytesInPlace(address, key - keyOffset, bytes);
    if (inPlace.isOk() && *inPlace != nullptr) bytesReadInPlace += bytes;
    return inPlace;
  }

  bool canWritePeer() const override { return !refuseWrites && inner_->canWritePeer(); }
  bool pushSpeedsUp(uint64_t sourceKey, uint64_t targetKey) const override {
    return inner_->pushSpeedsUp(sourceKey - keyOffset, targetKey - keyOffset);
  }
  Status writePeer(uint64_t address, uint64_t key, const void* from, size_t bytes) override {
    if (failWrites) return errnoStatus("process_vm_writev", EPERM);
    ++writes;
    bytesWritten += bytes;
    return inner_->writePeer(address, key - keyOffset, from, bytes);
  }

  size_t reads = 0, bytesRead = 0, bytesReadInPlace = 0;
  size_t writes = 0, bytesWritten = 0;
  bool failReads = false;
  bool failWrites = false;    // writePeer() fails, as under a seccomp profile that forbids it
  bool refuseWrites = false;  // canWritePeer() says no, as RDMA's
  bool refuseKeys = false;    // as RDMA for a buffer nobody declared
  uint64_t keyOffset = 0;     // added to the inner stream's keys, as a registration's would be
  std::vector<uint64_t> keysSeen;

 private:
  std::unique_ptr<ByteStream> inner_;
};

// Options under which a descriptor waits for its receive as long as a test runs.
inline StreamConnection::Options patient() {
  StreamConnection::Options options;
  options.unclaimedDescriptorWait = std::chrono::hours(1);
  return options;
}

// Both ends of one connection, in this process. For shm and shm_cma the
// streams are TestStreams (as, bs), owned by the connections.
struct Pair {
  std::unique_ptr<StreamConnection> a, b;
  TestStream *as = nullptr, *bs = nullptr;
  explicit Pair(const std::string& kind, StreamConnection::Options options = {},
                size_t ringBytes = kRingBytes) {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    if (kind == "tcp") {
      a = std::make_unique<StreamConnection>(
          std::make_unique<tcp::SocketStream>(tcp::Fd(fds[0]), 1), 1, options);
      b = std::make_unique<StreamConnection>(
          std::make_unique<tcp::SocketStream>(tcp::Fd(fds[1]), 0), 0, options);
      return;
    }
    auto created = shm::Segment::create(shm::segmentBytes(ringBytes));
    EXPECT_TRUE(created.isOk()) << created.status().message();
    shm::ShmStream::initialize(*created, ringBytes);
    auto opened = shm::Segment::open(created->name(), shm::segmentBytes(ringBytes));
    EXPECT_TRUE(opened.isOk()) << opened.status().message();
    created->unlink();
    auto sa =
        std::make_unique<shm::ShmStream>(std::move(*created), ringBytes, true, tcp::Fd(fds[0]), 1);
    auto sb =
        std::make_unique<shm::ShmStream>(std::move(*opened), ringBytes, false, tcp::Fd(fds[1]), 0);
    if (kind == "shm_cma") {
      sa->enableReadPeer(::getpid());
      sb->enableReadPeer(::getpid());
    }
    auto ta = std::make_unique<TestStream>(std::move(sa));
    auto tb = std::make_unique<TestStream>(std::move(sb));
    as = ta.get();
    bs = tb.get();
    a = std::make_unique<StreamConnection>(std::move(ta), 1, options);
    b = std::make_unique<StreamConnection>(std::move(tb), 0, options);
  }
  // Drives both ends until every request is no longer pending (or 5 s).
  void drive(std::initializer_list<RequestPtr> requests) {
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      if (a) (void)a->progress();
      if (b) (void)b->progress();
      bool pending = false;
      for (const auto& r : requests) pending = pending || r->state() == Request::State::kPending;
      if (!pending) return;
    }
    ADD_FAILURE() << "requests still pending after 5 s";
  }
};

inline Tag tag(uint64_t value, uint64_t check = 7) {
  return {value, check};
}

// ---- Single copy: descriptors, acks, and copies from the peer's memory.

class SingleCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!selfReadable()) GTEST_SKIP() << "process_vm_readv is not permitted here";
  }
};

inline std::vector<uint8_t> pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 7 + seed + (i >> 12));
  return v;
}

// dst = local + incoming, byte by byte, in elements of `unit` bytes; notes
// any call that would split an element.
struct Adder {
  size_t unit = 1;
  const uint8_t* dst = nullptr;
  mutable size_t units = 0, calls = 0;
  mutable bool split = false;
  static void apply(void* dst, const void* local, const void* incoming, size_t units,
                    const void* context) {
    const auto& self = *static_cast<const Adder*>(context);
    auto* d = static_cast<uint8_t*>(dst);
    const auto* l = static_cast<const uint8_t*>(local);
    const auto* in = static_cast<const uint8_t*>(incoming);
    self.split = self.split || (d - self.dst) % self.unit != 0;
    for (size_t i = 0; i < units * self.unit; ++i) d[i] = static_cast<uint8_t>(l[i] + in[i]);
    self.units += units;
    ++self.calls;
  }
};

}  // namespace braid::transport
