// The RDMA byte stream (transports/ib/rdma_stream.h): the connection
// handshake over a socket, bytes through rings smaller than the data,
// credits that hold a sender to the space and the writes the receiver
// allows, sleeping on the completion queue, the end of the stream, a peer
// that is gone, and StreamConnection's tagged messages over it.
//
// On the software model of the verbs by default (two model devices). With
// IBV_DEV=<device> (and a build with the verbs headers) the same tests run
// on that real device, both ends on it: tools/rdma-guest-tests.sh runs
// them so on Soft-RoCE inside a virtual machine.
#include "transports/ib/rdma_stream.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "transports/ib/model_verbs.h"
#include "transports/ib/port_choice.h"
#if BRAID_IB_VERBS
#include "transports/ib/real_verbs.h"
#include "transports/ib/verbs_library.h"
#endif
#include "transports/stream_connection.h"

namespace braid::ib {
namespace {

// The device of end `end` (0 or 1): a model device, or IBV_DEV's.
Result<std::unique_ptr<Device>> openDevice(int end) {
  const char* real = std::getenv("IBV_DEV");
  if (!real || !*real) return openModelDevice(end == 0 ? "model0" : "model1");
#if BRAID_IB_VERBS
  static std::shared_ptr<const VerbsLibrary> library = [] {
    auto lib = VerbsLibrary::open(kVerbsLibrary);
    return lib.isOk() ? std::shared_ptr<const VerbsLibrary>(std::move(*lib)) : nullptr;
  }();
  if (!library) return notSupported("IBV_DEV is set, but libibverbs did not load");
  return openVerbsDevice(library, real);
#else
  return notSupported("IBV_DEV is set, but this build has no verbs headers");
#endif
}

// Both ends use port 1; the GID index is what the transport would choose.
int gidIndexFor(Device& device) {
  auto index = chooseGidIndex(device, 1, -1);
  EXPECT_TRUE(index.isOk()) << index.status().message();
  return index.isOk() ? *index : 0;
}

struct StreamPair {
  std::unique_ptr<RdmaStream> a, b;
};

// Two ends on the model's two devices, connected over a socketpair.
Result<StreamPair> connectPair(RdmaStreamOptions aOptions, RdmaStreamOptions bOptions = {},
                               bool sameOptions = true) {
  if (sameOptions) bOptions = aOptions;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return errnoStatus("socketpair", errno);
  tcp::Fd fa(fds[0]), fb(fds[1]);
  auto da = openDevice(0);
  auto db = openDevice(1);
  if (!da.isOk()) return da.status();
  if (!db.isOk()) return db.status();
  aOptions.gidIndex = gidIndexFor(**da);
  bOptions.gidIndex = gidIndexFor(**db);
  auto otherEnd = std::async(std::launch::async, [&] {
    tcp::SocketWire wire(fb.get(), Deadline::after(10));
    return RdmaStream::connect(**db, wire, bOptions, 0);
  });
  tcp::SocketWire wire(fa.get(), Deadline::after(10));
  auto a = RdmaStream::connect(**da, wire, aOptions, 1);
  auto b = otherEnd.get();
  if (!a.isOk()) return a.status();
  if (!b.isOk()) return b.status();
  return StreamPair{std::move(*a), std::move(*b)};
}

RdmaStreamOptions smallRings() {
  RdmaStreamOptions o;
  o.ringBytes = 4096;
  o.maxWriteBytes = 1024;
  o.window = 8;
  return o;
}

// On the model a write has landed when its post returns; on hardware it
// lands later, so the helpers below wait for what the tests expect, up to
// a deadline.
using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kPatience{10};

size_t write(RdmaStream& s, const void* data, size_t bytes) {
  iovec v{const_cast<void*>(data), bytes};
  auto n = s.writeSome(&v, 1);
  EXPECT_TRUE(n.isOk()) << n.status().message();
  return n.isOk() ? *n : 0;
}

// Writes all `bytes`, waiting for credits as needed.
bool writeAll(RdmaStream& s, const void* data, size_t bytes) {
  const auto deadline = Clock::now() + kPatience;
  size_t done = 0;
  while (done < bytes && Clock::now() < deadline) {
    iovec v{static_cast<uint8_t*>(const_cast<void*>(data)) + done, bytes - done};
    auto n = s.writeSome(&v, 1);
    if (!n.isOk()) return false;
    done += *n;
  }
  return done == bytes;
}

// Reads exactly `bytes`, waiting for them to land.
bool readAll(RdmaStream& s, void* into, size_t bytes) {
  const auto deadline = Clock::now() + kPatience;
  size_t done = 0;
  while (done < bytes && Clock::now() < deadline) {
    auto n = s.readSome(static_cast<uint8_t*>(into) + done, bytes - done);
    EXPECT_TRUE(n.isOk()) << n.status().message();
    if (!n.isOk()) return false;
    done += *n;
  }
  return done == bytes;
}

bool readable(int fd, int waitMs) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, waitMs) == 1;
}

TEST(RdmaStreamCard, RoundTripsAndRefusesWhatIsNotACard) {
  RdmaStreamCard c;
  c.address.qpn = 0x123456;
  c.address.psn = 0xabcdef;
  c.address.lid = 7;
  c.address.gid.raw[15] = 9;
  c.address.gidIndex = 3;
  c.ringAddr = 0x7fff00001000;
  c.ringRkey = 42;
  c.ringBytes = 1 << 20;
  c.window = 64;
  c.mtu = Mtu::k4096;
  auto wire = c.encode();
  ASSERT_EQ(wire.size(), RdmaStreamCard::kWireBytes);
  auto back = RdmaStreamCard::decode(wire);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->address.qpn, c.address.qpn);
  EXPECT_EQ(back->address.psn, c.address.psn);
  EXPECT_EQ(back->address.lid, 7);
  EXPECT_EQ(back->address.gid, c.address.gid);
  EXPECT_EQ(back->address.gidIndex, 3);
  EXPECT_EQ(back->ringAddr, c.ringAddr);
  EXPECT_EQ(back->ringRkey, 42u);
  EXPECT_EQ(back->ringBytes, c.ringBytes);
  EXPECT_EQ(back->window, 64u);
  EXPECT_EQ(back->mtu, Mtu::k4096);

  auto bad = wire;
  bad[0] ^= 1;
  EXPECT_FALSE(RdmaStreamCard::decode(bad).isOk());
  EXPECT_FALSE(RdmaStreamCard::decode({wire.begin(), wire.end() - 1}).isOk());
  bad = wire;
  bad.back() = 9;  // no such MTU
  EXPECT_FALSE(RdmaStreamCard::decode(bad).isOk());
}

TEST(RdmaStream, BytesCrossBothWaysThroughRingsSmallerThanTheData) {
  auto pair = connectPair(smallRings());
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  std::vector<uint8_t> data(100000);
  std::iota(data.begin(), data.end(), 0);
  for (auto [from, to] :
       {std::pair{pair->a.get(), pair->b.get()}, {pair->b.get(), pair->a.get()}}) {
    std::vector<uint8_t> got(data.size());
    size_t sent = 0, received = 0;
    const auto deadline = Clock::now() + kPatience;
    while (received < data.size() && Clock::now() < deadline) {
      sent += write(*from, data.data() + sent, std::min<size_t>(3000, data.size() - sent));
      auto n = to->readSome(got.data() + received, std::min<size_t>(1700, got.size() - received));
      ASSERT_TRUE(n.isOk()) << n.status().message();
      received += *n;
    }
    EXPECT_EQ(sent, data.size());
    EXPECT_EQ(got, data);
  }
}

TEST(RdmaStream, TwoThreadsStreamQuarterOfAMegabyteEachWay) {
  auto pair = connectPair(smallRings());
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  std::vector<uint8_t> data(1 << 18);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + (i >> 12));
  // Each end on its own thread, writing and reading, as two ranks would.
  auto run = [&](RdmaStream& s, std::vector<uint8_t>& got) {
    size_t sent = 0, received = 0;
    const auto deadline = Clock::now() + kPatience;
    while ((sent < data.size() || received < got.size()) && Clock::now() < deadline) {
      if (sent < data.size()) {
        iovec v{data.data() + sent, std::min<size_t>(5000, data.size() - sent)};
        auto n = s.writeSome(&v, 1);
        if (!n.isOk()) return n.status();
        sent += *n;
      }
      auto n = s.readSome(got.data() + received, got.size() - received);
      if (!n.isOk()) return n.status();
      received += *n;
    }
    return received == got.size() ? Status::ok() : timeoutError("stream stalled");
  };
  std::vector<uint8_t> gotA(data.size()), gotB(data.size());
  auto b = std::async(std::launch::async, [&] { return run(*pair->b, gotB); });
  Status a = run(*pair->a, gotA);
  Status bStatus = b.get();
  EXPECT_TRUE(a.isOk()) << a.message();
  EXPECT_TRUE(bStatus.isOk()) << bStatus.message();
  EXPECT_EQ(gotA, data);
  EXPECT_EQ(gotB, data);
}

TEST(RdmaStream, ASenderStopsAtTheRingTheReceiverHasNotRead) {
  auto pair = connectPair(smallRings());
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  std::vector<uint8_t> data(10000, 5);
  EXPECT_EQ(write(*pair->a, data.data(), data.size()), 4096u);
  EXPECT_EQ(write(*pair->a, data.data(), data.size()), 0u);
  EXPECT_EQ(pair->a->bytesInFlight(), 4096u);
  // Reading returns the credits, and with them the room.
  std::vector<uint8_t> got(4096);
  EXPECT_TRUE(readAll(*pair->b, got.data(), got.size()));
  EXPECT_TRUE(writeAll(*pair->a, data.data(), 1000));
  EXPECT_EQ(pair->a->bytesInFlight(), 1000u);
}

TEST(RdmaStream, ASenderStopsAtTheWindowOfWrites) {
  auto pair = connectPair(smallRings());
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  const uint8_t byte = 1;
  size_t accepted = 0;
  for (int i = 0; i < 20; ++i) accepted += write(*pair->a, &byte, 1);
  EXPECT_EQ(accepted, 8u);  // the window
  EXPECT_EQ(pair->a->writesInFlight(), 8u);
  uint8_t got[8];
  EXPECT_TRUE(readAll(*pair->b, got, sizeof got));
  EXPECT_TRUE(writeAll(*pair->a, &byte, 1));
}

TEST(RdmaStream, ASleepingReaderIsWokenByItsCompletionQueue) {
  auto pair = connectPair(smallRings());
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  RdmaStream& b = *pair->b;
  ASSERT_GE(b.pollFd(), 0);
  EXPECT_TRUE(b.prepareToSleep(false));
  EXPECT_FALSE(readable(b.pollFd(), 0));
  const uint8_t byte = 7;
  EXPECT_EQ(write(*pair->a, &byte, 1), 1u);
  EXPECT_TRUE(readable(b.pollFd(), 5000));
  uint8_t got = 0;
  EXPECT_TRUE(readAll(b, &got, 1));
  EXPECT_EQ(got, 7);
  // Bytes that came before the queue was armed forbid the sleep.
  EXPECT_EQ(write(*pair->a, &byte, 1), 1u);
  ::usleep(200000);  // landed, on hardware too
  EXPECT_FALSE(b.prepareToSleep(false));
  EXPECT_TRUE(readAll(b, &got, 1));
  // A sender out of room sleeps until the credits come back. Its first
  // looks take its own writes' completions, which forbid a sleep.
  std::vector<uint8_t> data(4096, 1);
  EXPECT_EQ(write(*pair->a, data.data(), data.size()), 4096u);
  bool sleeps = false;
  for (int i = 0; i < 100 && !sleeps; ++i) {
    sleeps = pair->a->prepareToSleep(true);
    if (!sleeps) ::usleep(10000);
  }
  EXPECT_TRUE(sleeps);
  std::vector<uint8_t> sink(4096);
  EXPECT_TRUE(readAll(b, sink.data(), sink.size()));
  EXPECT_TRUE(readable(pair->a->pollFd(), 5000));
}

TEST(RdmaStream, TheReaderSeesEveryByteThenTheEnd) {
  auto pair = connectPair(smallRings());
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  const char text[] = "last words";
  iovec v{const_cast<char*>(text), sizeof text};
  pair->a->writeLast(&v, 1);
  pair->a->close();
  char got[sizeof text] = {};
  EXPECT_TRUE(readAll(*pair->b, got, sizeof got));
  EXPECT_STREQ(got, text);
  Result<size_t> end = size_t{0};
  const auto deadline = Clock::now() + kPatience;
  while (end.isOk() && Clock::now() < deadline) end = pair->b->readSome(got, sizeof got);
  ASSERT_FALSE(end.isOk());
  EXPECT_EQ(end.status().code(), ErrorCode::kRemoteError);
  EXPECT_NE(end.status().message().find("closed"), std::string::npos) << end.status().message();
}

TEST(RdmaStream, AWatchedSocketThatClosesEndsTheStreamAfterItsBytes) {
  auto pair = connectPair(smallRings());
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  tcp::Fd peerEnd(fds[1]);
  ASSERT_TRUE(pair->b->watchPeerSocket(tcp::Fd(fds[0])).isOk());
  EXPECT_TRUE(pair->b->prepareToSleep(false));
  EXPECT_FALSE(readable(pair->b->pollFd(), 0));
  const uint8_t byte = 3;
  EXPECT_EQ(write(*pair->a, &byte, 1), 1u);
  peerEnd = tcp::Fd();  // the peer's process is gone
  EXPECT_TRUE(readable(pair->b->pollFd(), 5000));
  uint8_t got = 0;
  EXPECT_TRUE(readAll(*pair->b, &got, 1));  // what came before is still read
  EXPECT_EQ(got, 3);
  auto end = pair->b->readSome(&got, 1);
  ASSERT_FALSE(end.isOk());
  EXPECT_EQ(end.status().code(), ErrorCode::kRemoteError);
  EXPECT_NE(end.status().message().find("exited or aborted"), std::string::npos)
      << end.status().message();
}

TEST(RdmaStream, APeerThatIsGoneIsARemoteErrorWithTheStatusSpelledOut) {
  RdmaStreamOptions quick = smallRings();
  quick.timeout = 12;  // 17 ms per attempt
  quick.retryCount = 2;
  auto pair = connectPair(quick);
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  pair->b.reset();
  const uint8_t byte = 1;
  iovec v{const_cast<uint8_t*>(&byte), 1};
  Result<size_t> written = size_t{0};
  const auto deadline = Clock::now() + kPatience;
  while (written.isOk() && Clock::now() < deadline) written = pair->a->writeSome(&v, 1);
  ASSERT_FALSE(written.isOk());
  const std::string message = written.status().message();
  EXPECT_EQ(written.status().code(), ErrorCode::kRemoteError) << message;
  EXPECT_NE(message.find("status 12"), std::string::npos) << message;
  EXPECT_NE(message.find("retry"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
}

TEST(RdmaStream, EndsWithDifferentRingsRefuseToConnect) {
  RdmaStreamOptions other = smallRings();
  other.ringBytes = 8192;
  auto pair = connectPair(smallRings(), other, false);
  ASSERT_FALSE(pair.isOk());
  EXPECT_EQ(pair.status().code(), ErrorCode::kInvalidUsage) << pair.status().message();
}

TEST(RdmaStream, BadOptionsAreRefusedBeforeAnythingIsMade) {
  auto device = openDevice(0);
  ASSERT_TRUE(device.isOk()) << device.status().message();
  tcp::Fd none;
  tcp::SocketWire wire(none.get(), Deadline::after(1));
  RdmaStreamOptions o = smallRings();
  o.ringBytes = 5000;
  EXPECT_EQ(RdmaStream::connect(**device, wire, o, 1).status().code(), ErrorCode::kInvalidArgument);
  o = smallRings();
  o.maxWriteBytes = 8192;
  EXPECT_EQ(RdmaStream::connect(**device, wire, o, 1).status().code(), ErrorCode::kInvalidArgument);
  o = smallRings();
  o.window = 0;
  EXPECT_EQ(RdmaStream::connect(**device, wire, o, 1).status().code(), ErrorCode::kInvalidArgument);
}

// The framing layer over RDMA, as it runs over TCP and shared memory:
// messages matched by tag, one larger than the ring, out of order posts.
TEST(RdmaStream, CarriesStreamConnectionMessages) {
  auto pair = connectPair(smallRings());
  ASSERT_TRUE(pair.isOk()) << pair.status().message();
  transport::StreamConnection a(std::move(pair->a), 1), b(std::move(pair->b), 0);
  std::vector<uint8_t> big(50000), small(100, 7), gotBig(big.size()), gotSmall(small.size());
  std::iota(big.begin(), big.end(), 3);
  auto s1 = a.postSend(big.data(), big.size(), {1, 11});
  auto s2 = a.postSend(small.data(), small.size(), {2, 22});
  // Posted in the other order: the small one is kept until asked for.
  auto r2 = b.postRecv(gotSmall.data(), gotSmall.size(), {2, 22});
  auto r1 = b.postRecv(gotBig.data(), gotBig.size(), {1, 11});
  const auto deadline = Clock::now() + kPatience;
  while (Clock::now() < deadline) {
    ASSERT_TRUE(a.progress().isOk());
    ASSERT_TRUE(b.progress().isOk());
    bool done = true;
    for (auto* r : {s1.get(), s2.get(), r1.get(), r2.get()}) {
      ASSERT_NE(r->state(), transport::Request::State::kFailed) << r->error().message();
      done = done && r->state() == transport::Request::State::kDone;
    }
    if (done) break;
  }
  EXPECT_EQ(r1->state(), transport::Request::State::kDone);
  EXPECT_EQ(r2->state(), transport::Request::State::kDone);
  EXPECT_EQ(gotBig, big);
  EXPECT_EQ(gotSmall, small);
}

// Large messages between buffers the user declared (braidCommRegister):
// the receiver reads them with RDMA, straight into place when its buffer
// is declared too, else through its bounce buffer; undeclared sends go
// through the rings.
struct ReadingPair {
  std::shared_ptr<transport::MemoryRegistry> aMemory =
                                                 std::make_shared<transport::MemoryRegistry>(),
                                             bMemory =
                                                 std::make_shared<transport::MemoryRegistry>();
  RdmaStream *aStream = nullptr, *bStream = nullptr;
  std::unique_ptr<transport::StreamConnection> a, b;

  explicit ReadingPair(size_t bounceBytes = 1 << 18) {
    RdmaStreamOptions ao = smallRings(), bo = smallRings();
    ao.registry = aMemory;
    bo.registry = bMemory;
    ao.bounceBytes = bo.bounceBytes = bounceBytes;
    auto pair = connectPair(ao, bo, false);
    EXPECT_TRUE(pair.isOk()) << pair.status().message();
    if (!pair.isOk()) return;
    aStream = pair->a.get();
    bStream = pair->b.get();
    transport::StreamConnection::Options options;
    options.readPeerBytes = 1024;
    options.unclaimedDescriptorWait = std::chrono::hours(1);
    a = std::make_unique<transport::StreamConnection>(std::move(pair->a), 1, options);
    b = std::make_unique<transport::StreamConnection>(std::move(pair->b), 0, options);
  }

  // Sends `data` from a to b into `got`; true when both requests are done.
  bool move(const std::vector<uint8_t>& data, std::vector<uint8_t>& got, uint64_t tag) {
    auto r = b->postRecv(got.data(), got.size(), {tag, tag});
    auto s = a->postSend(data.data(), data.size(), {tag, tag});
    const auto deadline = Clock::now() + kPatience;
    while (Clock::now() < deadline) {
      EXPECT_TRUE(a->progress().isOk());
      EXPECT_TRUE(b->progress().isOk());
      for (auto* q : {s.get(), r.get()})
        if (q->state() == transport::Request::State::kFailed) {
          ADD_FAILURE() << q->error().message();
          return false;
        }
      if (s->state() == transport::Request::State::kDone &&
          r->state() == transport::Request::State::kDone)
        return true;
    }
    ADD_FAILURE() << "not done in time";
    return false;
  }
};

std::vector<uint8_t> counting(size_t bytes, uint8_t from) {
  std::vector<uint8_t> v(bytes);
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(RdmaRead, DeclaredBuffersCrossInOneReadAndStayRegistered) {
  ReadingPair p;
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint8_t> data = counting(200000, 5), got(data.size());
  ASSERT_TRUE(p.aMemory->add(data.data(), data.size()).isOk());
  ASSERT_TRUE(p.bMemory->add(got.data(), got.size()).isOk());
  ASSERT_TRUE(p.move(data, got, 1));
  EXPECT_EQ(got, data);
  EXPECT_EQ(p.aStream->registrations()->made(), 1u) << "the sender's buffer, for the peer";
  EXPECT_EQ(p.bStream->registrations()->made(), 1u) << "the receiver's, to read into";
  EXPECT_EQ(p.bStream->readsPosted(), 1u) << "200000 bytes past a 4096-byte ring in one read";
  std::fill(got.begin(), got.end(), 0);
  data[777] ^= 0xff;
  ASSERT_TRUE(p.move(data, got, 2));
  EXPECT_EQ(got, data);
  EXPECT_EQ(p.aStream->registrations()->made(), 1u) << "the registration was kept";
  EXPECT_EQ(p.bStream->registrations()->made(), 1u);
  EXPECT_EQ(p.bStream->readsPosted(), 2u);
}

TEST(RdmaRead, AnUndeclaredReceiveBufferIsFilledThroughTheBounceBuffer) {
  ReadingPair p(4096);
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint8_t> data = counting(50000, 9), got(data.size());
  ASSERT_TRUE(p.aMemory->add(data.data(), data.size()).isOk());
  ASSERT_TRUE(p.move(data, got, 1));
  EXPECT_EQ(got, data);
  EXPECT_GE(p.bStream->readsPosted(), 13u) << "50000 bytes in reads of 4096 at most";
  EXPECT_EQ(p.bStream->registrations()->made(), 0u);
}

TEST(RdmaRead, AnUndeclaredSendBufferGoesThroughTheRings) {
  ReadingPair p;
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint8_t> data = counting(50000, 1), got(data.size());
  ASSERT_TRUE(p.bMemory->add(got.data(), got.size()).isOk());
  ASSERT_TRUE(p.move(data, got, 1));
  EXPECT_EQ(got, data);
  EXPECT_EQ(p.bStream->readsPosted(), 0u);
  EXPECT_EQ(p.aStream->registrations()->made(), 0u);
}

TEST(RdmaRead, ADeregisteredBufferIsReleasedAndGoesThroughTheRings) {
  ReadingPair p;
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint8_t> data = counting(50000, 2), got(data.size());
  auto id = p.aMemory->add(data.data(), data.size());
  ASSERT_TRUE(id.isOk());
  ASSERT_TRUE(p.move(data, got, 1));
  EXPECT_EQ(p.bStream->readsPosted(), 1u);
  EXPECT_EQ(p.aStream->registrations()->held(), 1u);
  ASSERT_TRUE(p.aMemory->remove(*id).isOk());
  std::fill(got.begin(), got.end(), 0);
  ASSERT_TRUE(p.move(data, got, 2));
  EXPECT_EQ(got, data);
  EXPECT_EQ(p.bStream->readsPosted(), 1u) << "no read of memory no longer declared";
  EXPECT_EQ(p.aStream->registrations()->held(), 0u);
}

// A read past the registration is refused by the sender's side of the
// queue pair (an access check of the verbs), and the reader is told.
TEST(RdmaRead, AReadOutsideTheRegistrationIsARemoteError) {
  ReadingPair p;
  ASSERT_TRUE(p.aStream && p.bStream);
  std::vector<uint8_t> data(8192), got(8192);
  ASSERT_TRUE(p.aMemory->add(data.data(), 4096).isOk());
  auto key = p.aStream->peerReadKey(data.data(), 4096);
  ASSERT_TRUE(key.has_value());
  EXPECT_FALSE(p.aStream->peerReadKey(data.data(), 4097).has_value());
  const auto address = reinterpret_cast<uint64_t>(data.data());
  ASSERT_TRUE(p.bStream->readPeer(got.data(), address, *key, 4096).isOk());
  Status past = p.bStream->readPeer(got.data(), address + 2048, *key, 4096);
  ASSERT_FALSE(past.isOk());
  EXPECT_EQ(past.code(), ErrorCode::kRemoteError) << past.message();
  EXPECT_NE(past.message().find("read"), std::string::npos) << past.message();
  EXPECT_NE(past.message().find("outside its registration"), std::string::npos) << past.message();
}

}  // namespace
}  // namespace braid::ib
