// Shared host allocations (braidHostAlloc): keys, and a peer process that
// maps them, reads them, and notices one that was freed.
#include "transports/shm/host_allocations.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace braid::shm {
namespace {

std::vector<uint8_t> pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(i * 13 + seed + (i >> 12));
  return v;
}

TEST(HostAllocations, ZeroedPageAlignedAndKeyedOnlyInside) {
  const size_t bytes = 3 * 4096 + 5;
  auto allocated = allocateShared(bytes);
  ASSERT_TRUE(allocated.isOk()) << allocated.status().message();
  auto* p = static_cast<uint8_t*>(*allocated);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(p[i], 0) << i;
  std::memset(p, 0xab, bytes);

  auto whole = sharedKey(p, bytes);
  ASSERT_TRUE(whole.has_value());
  EXPECT_TRUE(isSharedKey(*whole));
  EXPECT_EQ(sharedKey(p + 100, bytes - 100), whole) << "a range inside has the same key";
  EXPECT_EQ(sharedKey(p + bytes, 0), whole) << "the empty range at the end is inside";
  EXPECT_FALSE(sharedKey(p, bytes + 1).has_value()) << "one byte past the end";
  EXPECT_FALSE(sharedKey(p + 1, bytes).has_value());
  EXPECT_FALSE(sharedKey(p - 1, 2).has_value()) << "starts in the header page";
  std::vector<uint8_t> ordinary(bytes);
  EXPECT_FALSE(sharedKey(ordinary.data(), ordinary.size()).has_value());

  auto other = allocateShared(1);
  ASSERT_TRUE(other.isOk());
  auto otherKey = sharedKey(*other, 1);
  ASSERT_TRUE(otherKey.has_value());
  EXPECT_NE(*otherKey, *whole) << "each allocation has its own key";
  EXPECT_TRUE(freeShared(*other).isOk());
  EXPECT_TRUE(freeShared(p).isOk());
  EXPECT_FALSE(sharedKey(p, 1).has_value()) << "freed memory has no key";
}

TEST(HostAllocations, FreeRefusesWhatItDidNotAllocate) {
  std::vector<uint8_t> ordinary(64);
  Status s = freeShared(ordinary.data());
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not an allocation of braidHostAlloc"), std::string::npos)
      << s.message();

  auto allocated = allocateShared(100);
  ASSERT_TRUE(allocated.isOk());
  auto* p = static_cast<uint8_t*>(*allocated);
  EXPECT_EQ(freeShared(p + 8).code(), ErrorCode::kInvalidArgument) << "an inner pointer";
  EXPECT_TRUE(freeShared(p).isOk());
  EXPECT_EQ(freeShared(p).code(), ErrorCode::kInvalidArgument) << "freed twice";
  EXPECT_EQ(allocateShared(0).status().code(), ErrorCode::kInvalidArgument);
}

// Whether this process may open another's /proc/<pid>/fd entries (ptrace
// read access); as process_vm_readv's tests, skipped where it may not.
bool mayOpenChildFds() {
  int fds[2];
  if (::pipe(fds) != 0) return false;
  pid_t child = ::fork();
  if (child == 0) {
    char c;
    (void)!::read(fds[0], &c, 1);
    _exit(0);
  }
  const std::string path = "/proc/" + std::to_string(child) + "/fd/" + std::to_string(fds[1]);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
  const bool ok = fd >= 0;
  if (ok) ::close(fd);
  (void)!::write(fds[1], "x", 1);
  ::waitpid(child, nullptr, 0);
  ::close(fds[0]);
  ::close(fds[1]);
  return ok;
}

struct Offer {
  uint64_t address, key, bytes;
  uint8_t seed;
};

// A child that allocates on request and answers with an Offer; a byte 'f'
// frees its current allocation before the next one, 'q' ends it.
class AllocatingChild {
 public:
  AllocatingChild() {
    int down[2], up[2];
    EXPECT_EQ(::pipe(down), 0);
    EXPECT_EQ(::pipe(up), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(down[1]);
      ::close(up[0]);
      serve(down[0], up[1]);
    }
    ::close(down[0]);
    ::close(up[1]);
    toChild_ = down[1];
    fromChild_ = up[0];
  }
  ~AllocatingChild() {
    (void)!::write(toChild_, "q", 1);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child failed";
    ::close(toChild_);
    ::close(fromChild_);
  }
  pid_t pid() const { return pid_; }

  // 'a': allocate `bytes` filled with pattern(seed); 'f' first frees the last.
  Offer allocate(size_t bytes, uint8_t seed, bool freeLast) {
    const char command[2] = {freeLast ? 'f' : 'a', static_cast<char>(seed)};
    EXPECT_EQ(::write(toChild_, command, 2), 2);
    EXPECT_EQ(::write(toChild_, &bytes, sizeof(bytes)), static_cast<ssize_t>(sizeof(bytes)));
    Offer offer{};
    EXPECT_EQ(::read(fromChild_, &offer, sizeof(offer)), static_cast<ssize_t>(sizeof(offer)));
    return offer;
  }

 private:
  [[noreturn]] static void serve(int in, int out) {
    void* last = nullptr;
    for (;;) {
      char command[2];
      if (::read(in, command, 1) != 1 || command[0] == 'q') _exit(0);
      size_t bytes = 0;
      if (::read(in, command + 1, 1) != 1 || ::read(in, &bytes, sizeof(bytes)) != sizeof(bytes))
        _exit(10);
      if (command[0] == 'f' && last != nullptr && !freeShared(last).isOk()) _exit(11);
      auto allocated = allocateShared(bytes);
      if (!allocated.isOk()) _exit(12);
      const uint8_t seed = static_cast<uint8_t>(command[1]);
      std::vector<uint8_t> fill = pattern(bytes, seed);
      std::memcpy(*allocated, fill.data(), bytes);
      auto key = sharedKey(*allocated, bytes);
      if (!key) _exit(13);
      last = *allocated;
      Offer offer{reinterpret_cast<uintptr_t>(last), *key, bytes, seed};
      if (::write(out, &offer, sizeof(offer)) != sizeof(offer)) _exit(14);
    }
  }

  pid_t pid_ = -1;
  int toChild_ = -1, fromChild_ = -1;
};

class PeerAllocationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!mayOpenChildFds()) GTEST_SKIP() << "opening another process's /proc/<pid>/fd is refused";
  }
};

TEST_F(PeerAllocationsTest, MapsAPeersAllocationAndReadsItInPlace) {
  AllocatingChild child;
  PeerAllocations peer;
  peer.setPeer(child.pid(), 3);
  const size_t bytes = (1 << 20) + 12345;
  const Offer offer = child.allocate(bytes, 7, false);
  const std::vector<uint8_t> expected = pattern(bytes, 7);

  auto whole = peer.find(offer.address, offer.key, bytes);
  ASSERT_TRUE(whole.isOk()) << whole.status().message();
  EXPECT_EQ(std::memcmp(*whole, expected.data(), bytes), 0);
  auto middle = peer.find(offer.address + 4099, offer.key, 1000);
  ASSERT_TRUE(middle.isOk());
  EXPECT_EQ(*middle, *whole + 4099) << "the same mapping, not a new one";
  EXPECT_EQ(peer.mappedCount(), 1u);

  // Ranges that leave the allocation fail with the rank named, never read.
  for (auto [at, n] : {std::pair<uint64_t, size_t>{offer.address, bytes + 1},
                       {offer.address - 1, 1},
                       {offer.address + bytes, 1},
                       {offer.address + 8, ~size_t{0} - 4}}) {
    auto outside = peer.find(at, offer.key, n);
    ASSERT_FALSE(outside.isOk()) << at << " " << n;
    EXPECT_EQ(outside.status().code(), ErrorCode::kRemoteError);
    EXPECT_NE(outside.status().message().find("rank 3"), std::string::npos)
        << outside.status().message();
  }
}

// Freed, then allocated again: the fd number (and often the address) come
// back, and a reader that kept the old mapping must not read from it.
TEST_F(PeerAllocationsTest, AnAllocationFreedAndMadeAgainIsMappedAgain) {
  AllocatingChild child;
  PeerAllocations peer;
  peer.setPeer(child.pid(), 1);
  const size_t bytes = 256 << 10;
  const Offer first = child.allocate(bytes, 1, false);
  auto read1 = peer.find(first.address, first.key, bytes);
  ASSERT_TRUE(read1.isOk()) << read1.status().message();
  EXPECT_EQ(std::memcmp(*read1, pattern(bytes, 1).data(), bytes), 0);

  const Offer second = child.allocate(bytes, 2, true);
  EXPECT_NE(second.key, first.key);
  EXPECT_EQ(second.key >> 32, first.key >> 32) << "the fd number came back";
  auto read2 = peer.find(second.address, second.key, bytes);
  ASSERT_TRUE(read2.isOk()) << read2.status().message();
  EXPECT_EQ(std::memcmp(*read2, pattern(bytes, 2).data(), bytes), 0);
  EXPECT_EQ(peer.mappedCount(), 1u) << "the freed allocation was let go";

  // A descriptor of the freed one (a peer that freed memory in use) fails.
  auto stale = peer.find(first.address, first.key, bytes);
  ASSERT_FALSE(stale.isOk());
  EXPECT_EQ(stale.status().code(), ErrorCode::kRemoteError);
  EXPECT_NE(stale.status().message().find("has freed"), std::string::npos)
      << stale.status().message();
}

TEST_F(PeerAllocationsTest, KeepsAtMostEightAllocationsMapped) {
  AllocatingChild child;
  PeerAllocations peer;
  peer.setPeer(child.pid(), 1);
  std::vector<Offer> offers;
  for (int i = 0; i < 11; ++i) {
    offers.push_back(child.allocate(8192, static_cast<uint8_t>(i), false));
    auto got = peer.find(offers.back().address, offers.back().key, 8192);
    ASSERT_TRUE(got.isOk()) << got.status().message();
    EXPECT_LE(peer.mappedCount(), 8u);
  }
  // The first, let go, is mapped again when read again.
  auto again = peer.find(offers[0].address, offers[0].key, 8192);
  ASSERT_TRUE(again.isOk()) << again.status().message();
  EXPECT_EQ(std::memcmp(*again, pattern(8192, 0).data(), 8192), 0);
}

// A key naming an fd that is no shared allocation (a broken peer) fails
// with a message; opening it never blocks, whatever it is.
TEST_F(PeerAllocationsTest, AKeyNamingSomethingElseIsRefused) {
  int fifo[2];
  ASSERT_EQ(::pipe(fifo), 0);
  char tmpl[] = "/tmp/braid-not-an-allocation-XXXXXX";
  const int file = ::mkstemp(tmpl);
  ASSERT_GE(file, 0);
  ::unlink(tmpl);
  std::vector<uint8_t> junk(3 * 4096, 0x5a);
  ASSERT_EQ(::write(file, junk.data(), junk.size()), static_cast<ssize_t>(junk.size()));
  pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    _exit(0);
  }
  PeerAllocations peer;
  peer.setPeer(child, 2);
  const uint64_t bit = uint64_t{1} << 63;
  for (int fd : {fifo[0], file, 9999}) {
    auto got = peer.find(0x10000, bit | (static_cast<uint64_t>(fd) << 32) | 1, 16);
    ASSERT_FALSE(got.isOk()) << "fd " << fd;
    EXPECT_NE(got.status().message().find("rank 2"), std::string::npos) << got.status().message();
  }
  EXPECT_EQ(peer.mappedCount(), 0u);
  EXPECT_EQ(peer.find(0x10000, 12, 16).status().code(), ErrorCode::kInvalidArgument)
      << "not a shared key";
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(file);
  ::close(fifo[0]);
  ::close(fifo[1]);
}

}  // namespace
}  // namespace braid::shm
