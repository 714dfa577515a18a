// The rendezvous protocol over bytes (tcp::BufferWire): what rank 0 reads
// from a joining rank, what a rank reads back, rank 0's admission rules, and
// the unique id. The same functions read the sockets at init.
#include "src/bootstrap.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "src/common/deadline.h"
#include "src/common/env.h"
#include "src/communicator.h"

namespace braid {
namespace {

std::vector<uint8_t> u32(uint32_t v) {
  std::vector<uint8_t> out(4);
  std::memcpy(out.data(), &v, 4);
  return out;
}

std::vector<uint8_t> string(const std::string& s) {
  const auto length = static_cast<uint32_t>(s.size());
  std::vector<uint8_t> out(4 + s.size());
  std::memcpy(out.data(), &length, 4);
  if (!s.empty()) std::memcpy(out.data() + 4, s.data(), s.size());
  return out;
}

std::vector<uint8_t> operator+(std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

topo::RankTopology someTopology(std::string hostId) {
  topo::RankTopology t;
  t.hostname = "node-a";
  t.hostId = std::move(hostId);
  t.pid = 4242;
  t.cores = {0, 1, 2, 3};
  return t;
}

TEST(Rendezvous, JoinRequestAndTableRoundTrip) {
  const std::string card =
      encodePublished("127.0.0.1:4000", "BRAID_CHUNK_BYTES=4096", someTopology("node-a/1"));
  tcp::BufferWire sent({});
  ASSERT_TRUE(sendJoinRequest(sent, 3, card).isOk());
  tcp::BufferWire rank0(sent.sent());
  auto request = readJoinRequest(rank0);
  ASSERT_TRUE(request.isOk()) << request.status().message();
  EXPECT_EQ(request->nranks, 3u);
  EXPECT_EQ(request->address, card);

  const std::vector<uint8_t> answer = u32(0) + string(card) + string(card) + string(card);
  tcp::BufferWire rank1(answer);
  auto table = readRendezvousAnswer(rank1, 3);
  ASSERT_TRUE(table.isOk()) << table.status().message();
  ASSERT_EQ(table->size(), 3u);
  auto published = decodePublished((*table)[2], 2);
  ASSERT_TRUE(published.isOk()) << published.status().message();
  EXPECT_EQ(published->address, "127.0.0.1:4000");
  EXPECT_EQ(published->settings, "BRAID_CHUNK_BYTES=4096");
  EXPECT_EQ(published->topology, someTopology("node-a/1"));
}

// BRAID_HOSTID may be 256 bytes, and a host with many GPUs and NICs
// describes itself in far more than the 256 bytes an address needs: rank 0
// refused such a rank's join request as malformed, and init failed.
TEST(Rendezvous, JoinRequestCarriesALongTopology) {
  topo::RankTopology topology = someTopology(std::string(256, 'h'));
  for (int i = 0; i < 16; ++i) {
    topo::PciDevice gpu;
    gpu.busId = "0000:" + std::to_string(10 + i) + ":00.0";
    gpu.vendor = topo::kNvidiaVendor;
    topology.devices.push_back(gpu);
  }
  const std::string card =
      encodePublished("[fd00::1234:5678:9abc]:65000", "BRAID_CHUNK_BYTES=4096", topology);
  ASSERT_GT(card.size(), 800u);
  tcp::BufferWire sent({});
  ASSERT_TRUE(sendJoinRequest(sent, 2, card).isOk());
  tcp::BufferWire rank0(sent.sent());
  auto request = readJoinRequest(rank0);
  ASSERT_TRUE(request.isOk()) << request.status().message();
  EXPECT_EQ(request->address, card);

  tcp::BufferWire rank1(u32(0) + string(card) + string(card));
  auto table = readRendezvousAnswer(rank1, 2);
  ASSERT_TRUE(table.isOk()) << table.status().message();
  auto published = decodePublished((*table)[1], 1);
  ASSERT_TRUE(published.isOk()) << published.status().message();
  EXPECT_EQ(published->topology, topology);
}

TEST(Rendezvous, RefusalKeepsItsCodeAndReason) {
  tcp::BufferWire wire(u32(4) + string("rank 1 joined twice"));
  auto table = readRendezvousAnswer(wire, 2);
  ASSERT_FALSE(table.isOk());
  EXPECT_EQ(table.status().code(), ErrorCode::kInvalidUsage);
  EXPECT_NE(table.status().message().find("rank 1 joined twice"), std::string::npos)
      << table.status().message();
}

// Codes that are no error code of braid's: 256 used to become kOk (the
// code's low byte), an empty result that init took for success.
TEST(Rendezvous, AnswerWithAnUnknownCodeIsARemoteError) {
  for (uint32_t code : {256u, 0x32000000u, 10u, 255u}) {
    tcp::BufferWire wire(u32(code) + string("?"));
    auto table = readRendezvousAnswer(wire, 2);
    ASSERT_FALSE(table.isOk());
    EXPECT_EQ(table.status().code(), ErrorCode::kRemoteError) << code;
    EXPECT_NE(table.status().message().find(std::to_string(code)), std::string::npos)
        << table.status().message();
  }
}

TEST(Rendezvous, TruncatedOrOversizedMessagesAreErrors) {
  for (const auto& bytes : {u32(0) + string("127.0.0.1:1\nT1"), u32(0) + u32(1 << 30),
                            u32(0) + u32(20) + std::vector<uint8_t>(5, 'x'), u32(7)}) {
    tcp::BufferWire wire(bytes);
    auto table = readRendezvousAnswer(wire, 2);
    ASSERT_FALSE(table.isOk());
    EXPECT_EQ(table.status().code(), ErrorCode::kRemoteError) << table.status().message();
  }
  tcp::BufferWire join(u32(2) + u32(1 << 30));
  EXPECT_EQ(readJoinRequest(join).status().code(), ErrorCode::kRemoteError);
}

TEST(Rendezvous, StrangerIsRefusedAtTheHandshake) {
  Secret secret{};
  tcp::BufferWire wire(std::vector<uint8_t>(60, 0x62));
  auto request = greetJoiner(wire, secret);
  ASSERT_FALSE(request.isOk());
  EXPECT_EQ(request.status().code(), ErrorCode::kRemoteError);
  EXPECT_EQ(wire.sent().size(), 16u) << "only the nonce went out";
}

// A rendezvous server on loopback (30 s timeout), its secret `fill` bytes.
Result<RendezvousInfo> startOnLoopback(uint8_t fill) {
  RendezvousInfo info;
  info.secret.fill(fill);
  BRAID_ASSIGN_OR_RETURN(auto loopback, tcp::SocketAddress::parse("127.0.0.1:0"));
  BRAID_ASSIGN_OR_RETURN(info.root, startRendezvousServer(loopback, info.secret, 30));
  return info;
}

// Rank 0's rendezvous server over real sockets: a stranger that connects
// and says nothing is cut off as soon as every rank has joined. Before, it
// kept its greeter thread, and so the server's, until its 10 s handshake
// step ran out; a process that ended meanwhile left finished greeters
// unjoined, which ThreadSanitizer reports as a thread leak.
TEST(RendezvousServer, SilentStrangerIsCutOffOnceEveryRankJoined) {
  auto started = startOnLoopback(0x5a);
  ASSERT_TRUE(started.isOk()) << started.status().message();
  const RendezvousInfo info = *started;
  auto stranger = tcp::connectTo(info.root, Deadline::after(5));
  ASSERT_TRUE(stranger.isOk()) << stranger.status().message();

  std::vector<Result<std::vector<std::string>>> tables(2, internalError("not run"));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      auto client = RendezvousClient::connect(info, rank, Deadline::after(10));
      if (!client.isOk()) {
        tables[rank] = client.status();
        return;
      }
      tables[rank] = client->exchange(2, "rank-" + std::to_string(rank), Deadline::after(10));
    });
  }
  for (auto& t : ranks) t.join();
  for (auto& table : tables) {
    ASSERT_TRUE(table.isOk()) << table.status().message();
    EXPECT_EQ(*table, (std::vector<std::string>{"rank-0", "rank-1"}));
  }

  // The stranger reads the handshake's nonce, then the end of the stream.
  const auto start = std::chrono::steady_clock::now();
  bool ended = false;
  while (!ended && std::chrono::steady_clock::now() - start < std::chrono::seconds(3)) {
    pollfd readable{stranger->get(), POLLIN, 0};
    if (::poll(&readable, 1, 100) <= 0) continue;
    char bytes[64];
    ended = ::recv(stranger->get(), bytes, sizeof bytes, 0) <= 0;
  }
  EXPECT_TRUE(ended) << "the silent stranger was still connected 3 s after every rank joined";
  // The server's thread, and the greeter threads it joins, end too. Waiting
  // for that also orders their work (OpenSSL's locks among it) before the
  // process's exit, whose cleanup frees those locks.
  EXPECT_TRUE(awaitRendezvousServers(Deadline::after(5)))
      << "the rendezvous server was still running 5 s after every rank joined";
}

// A process that exits while its rendezvous server still waits for ranks (a
// job that never formed): the server's threads, which nobody joins, used
// libcrypto (nonces, a handshake's HMAC), and libcrypto's exit-time cleanup
// frees the locks behind it. The cleanup now stops the server first and
// waits for it; before, the server ran on through the cleanup (exit code 2).
// The rank that had joined hears at once that the rendezvous ended, rather
// than at its timeout. Run as a fresh process (tests/unit/rendezvous_at_exit.cc):
// one forked from this one may have its threads, with which ThreadSanitizer
// cannot start threads of its own.
TEST(RendezvousServer, StopsAtExitBeforeLibcryptoCleansUp) {
  const char* helper = std::getenv("RENDEZVOUS_AT_EXIT");
  ASSERT_NE(helper, nullptr) << "RENDEZVOUS_AT_EXIT names the helper (set by meson test)";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::execl(helper, helper, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the helper ended by a signal: " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: setup failed; 2: the server still ran after libcrypto's cleanup; 3: the joined rank "
         "was not told the rendezvous ended; 4: libcrypto's cleanup never ran; 127: no helper";
}

// A process forked while its parent's rendezvous server runs (a launcher
// that made the unique id, then forks its ranks) has none of the parent's
// threads: its own exit must not wait for them.
TEST(RendezvousServer, AForkedChildExitsWithoutWaitingForItsParentsServer) {
  auto started = startOnLoopback(0x4d);
  ASSERT_TRUE(started.isOk()) << started.status().message();
  const RendezvousInfo info = *started;

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const auto start = std::chrono::steady_clock::now();
    OPENSSL_cleanup();
    ::_exit(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by a signal: " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's cleanup waited for its parent's server";

  // The parent's server goes on: its one rank joins and it ends.
  auto client = RendezvousClient::connect(info, 0, Deadline::after(10));
  ASSERT_TRUE(client.isOk()) << client.status().message();
  auto table = client->exchange(1, "rank-0", Deadline::after(10));
  ASSERT_TRUE(table.isOk()) << table.status().message();
  EXPECT_EQ(*table, std::vector<std::string>{"rank-0"});
  EXPECT_TRUE(awaitRendezvousServers(Deadline::after(5)));
}

// Init waits for the server it was answered by, where its process runs it,
// and for no other: a unique id made for a later communicator keeps its
// server waiting for ranks, and must not hold up this one's init.
// A rendezvous that ended (here refused: two ranks that disagree on the
// world size; as well a unique id used a second time) no longer listens. A
// rank that comes later was refused the connection again and again until
// its whole timeout, and then blamed the address; a unique id's server
// listens from the moment the id exists, so a refused connection means it
// ended, and the rank says so at once. A launcher's rank 0 (init from the
// environment) starts its server in its own init, so there a refusal is
// still waited out.
TEST(RendezvousServer, ARankThatComesAfterTheRendezvousEndedIsToldAtOnce) {
  auto started = startOnLoopback(0x6b);
  ASSERT_TRUE(started.isOk()) << started.status().message();
  const RendezvousInfo info = *started;
  std::vector<Status> joined(2, internalError("not run"));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.emplace_back([&, rank] {
      auto client = RendezvousClient::connect(info, rank, Deadline::after(10));
      joined[rank] = client.isOk() ? client->exchange(2 + rank, "r", Deadline::after(10)).status()
                                   : client.status();
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(joined[0].code(), ErrorCode::kInvalidUsage) << joined[0].message();
  EXPECT_EQ(joined[1].code(), ErrorCode::kInvalidUsage) << joined[1].message();
  ASSERT_TRUE(awaitRendezvousServers(Deadline::after(5)));

  const auto start = std::chrono::steady_clock::now();
  auto late = RendezvousClient::connect(info, 1, Deadline::after(20));
  ASSERT_FALSE(late.isOk());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_EQ(late.status().code(), ErrorCode::kInvalidUsage) << late.status().message();
  EXPECT_NE(late.status().message().find("has ended"), std::string::npos)
      << late.status().message();

  RendezvousInfo fromEnvironment = info;
  fromEnvironment.serverStartsInRankZerosInit = true;
  auto waited = RendezvousClient::connect(fromEnvironment, 1, Deadline::after(0.5));
  ASSERT_FALSE(waited.isOk());
  EXPECT_EQ(waited.status().code(), ErrorCode::kTimeout) << waited.status().message();
}

// A rank proves itself at once (the handshake) but sends its join request
// only after its own setup (its transport, topology, devices), which on a
// loaded host may take longer than the few seconds a stranger is given.
// Once proven it has until the rendezvous's timeout; before, the server
// dropped it after the stranger's limit and it failed with "the rendezvous
// ended", while the others waited out their timeout.
TEST(RendezvousServer, AProvenRankMayTakeItsTimeOverItsJoinRequest) {
  RendezvousInfo info;
  info.secret.fill(0x7c);
  auto loopback = tcp::SocketAddress::parse("127.0.0.1:0");
  ASSERT_TRUE(loopback.isOk());
  auto root = startRendezvousServer(*loopback, info.secret, 30, /*strangerSeconds=*/1.0);
  ASSERT_TRUE(root.isOk()) << root.status().message();
  info.root = *root;
  std::vector<Result<std::vector<std::string>>> tables(2, internalError("not run"));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.emplace_back([&, rank] {
      auto client = RendezvousClient::connect(info, rank, Deadline::after(10));
      if (!client.isOk()) {
        tables[rank] = client.status();
        return;
      }
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      tables[rank] = client->exchange(2, "rank-" + std::to_string(rank), Deadline::after(10));
    });
  for (auto& t : ranks) t.join();
  for (auto& table : tables) {
    ASSERT_TRUE(table.isOk()) << table.status().message();
    EXPECT_EQ(*table, (std::vector<std::string>{"rank-0", "rank-1"}));
  }
  EXPECT_TRUE(awaitRendezvousServers(Deadline::after(5)));
}

size_t threadsOfThisProcess() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n;
}

// A flood of silent connections costs rank 0 a bounded number of greeting
// threads (each holds a thread and two descriptors): the oldest silent one
// makes room for a newer one once it has had a second. Before, each
// connection got a thread of its own, without limit, until the process ran
// out of descriptors or threads, and a thread that could not start ended
// the process. The ranks still join.
TEST(RendezvousServer, AFloodOfSilentConnectionsHoldsBoundedThreads) {
  auto started = startOnLoopback(0x19);
  ASSERT_TRUE(started.isOk()) << started.status().message();
  const RendezvousInfo info = *started;
  const size_t before = threadsOfThisProcess();
  std::vector<tcp::Fd> silent;
  for (int i = 0; i < 300; ++i) {
    auto stranger = tcp::connectTo(info.root, Deadline::after(5));
    ASSERT_TRUE(stranger.isOk()) << stranger.status().message();
    silent.push_back(std::move(*stranger));
  }
  size_t most = 0;
  for (int i = 0; i < 30; ++i) {
    most = std::max(most, threadsOfThisProcess());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_LE(most, before + 130) << "greeting threads for 300 silent connections";

  const auto start = std::chrono::steady_clock::now();
  std::vector<Result<std::vector<std::string>>> tables(2, internalError("not run"));
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank)
    ranks.emplace_back([&, rank] {
      auto client = RendezvousClient::connect(info, rank, Deadline::after(20));
      tables[rank] = client.isOk() ? client->exchange(2, "r", Deadline::after(20))
                                   : Result<std::vector<std::string>>(client.status());
    });
  for (auto& t : ranks) t.join();
  for (auto& table : tables) ASSERT_TRUE(table.isOk()) << table.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_TRUE(awaitRendezvousServers(Deadline::after(5)));
}

TEST(RendezvousServer, AwaitingOneServerIgnoresAnotherThatStillWaits) {
  auto waiting = startOnLoopback(0x21);
  auto answering = startOnLoopback(0x22);
  ASSERT_TRUE(waiting.isOk()) << waiting.status().message();
  ASSERT_TRUE(answering.isOk()) << answering.status().message();
  EXPECT_FALSE(awaitRendezvousServer(answering->root, Deadline::after(0.05)))
      << "no rank joined yet, so the server cannot have ended";

  auto client = RendezvousClient::connect(*answering, 0, Deadline::after(10));
  ASSERT_TRUE(client.isOk()) << client.status().message();
  auto table = client->exchange(1, "rank-0", Deadline::after(10));
  ASSERT_TRUE(table.isOk()) << table.status().message();
  EXPECT_TRUE(awaitRendezvousServer(answering->root, Deadline::after(5)));
  EXPECT_FALSE(awaitRendezvousServer(waiting->root, Deadline::after(0.05)));
  auto nowhere = tcp::SocketAddress::parse("127.0.0.1:1");
  ASSERT_TRUE(nowhere.isOk());
  EXPECT_TRUE(awaitRendezvousServer(*nowhere, Deadline::after(0)))
      << "no server of this process listens there";

  auto last = RendezvousClient::connect(*waiting, 0, Deadline::after(10));
  ASSERT_TRUE(last.isOk()) << last.status().message();
  ASSERT_TRUE(last->exchange(1, "rank-0", Deadline::after(10)).isOk());
  EXPECT_TRUE(awaitRendezvousServers(Deadline::after(5)));
}

TEST(RendezvousRoster, AdmitsEachRankOnceWithOneSize) {
  RendezvousRoster roster;
  EXPECT_EQ(roster.admit(-1, 2).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(roster.admit(2, 2).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(roster.admit(0, 0xFFFFFFFF).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(roster.nranks(), -1);
  EXPECT_TRUE(roster.admit(1, 2).isOk());
  EXPECT_EQ(roster.admit(0, 3).code(), ErrorCode::kInvalidUsage);
  EXPECT_EQ(roster.admit(1, 2).code(), ErrorCode::kInvalidUsage);
  EXPECT_FALSE(roster.complete());
  EXPECT_TRUE(roster.admit(0, 2).isOk());
  EXPECT_TRUE(roster.complete());
  EXPECT_EQ(roster.joined(), (std::set<int>{0, 1}));
}

char* idWithAddress(char (&id)[kUniqueIdBytes], const std::string& address) {
  RendezvousInfo info;
  info.root = *tcp::SocketAddress::parse("127.0.0.1:1");
  info.encode(id);
  id[4] = static_cast<char>(address.size());
  std::memset(id + 24, 0, kUniqueIdBytes - 24);
  std::memcpy(id + 24, address.data(), address.size());
  return id;
}

TEST(UniqueId, AcceptsTheAddressesItWrites) {
  char id[kUniqueIdBytes];
  for (const char* address : {"10.1.2.3:29500", "[::1]:7", "[fd00::1]:65535"}) {
    auto info = RendezvousInfo::decode(idWithAddress(id, address));
    ASSERT_TRUE(info.isOk()) << address << ": " << info.status().message();
    EXPECT_EQ(info->root.toString(), address);
  }
}

// braidGetUniqueId writes a numeric address; a host name in an id is
// garbage, and decoding it must not wait on a DNS server.
TEST(UniqueId, HostNameIsRefusedWithoutAskingDns) {
  char id[kUniqueIdBytes];
  auto info = RendezvousInfo::decode(idWithAddress(id, "localhost:29500"));
  ASSERT_FALSE(info.isOk());
  EXPECT_EQ(info.status().code(), ErrorCode::kInvalidArgument);
}

// getaddrinfo stops at a NUL: "127.0.0.1<NUL>junk:5" used to decode as
// 127.0.0.1:5.
TEST(UniqueId, AddressWithANulIsRefused) {
  char id[kUniqueIdBytes];
  auto info = RendezvousInfo::decode(idWithAddress(id, std::string("127.0.0.1\0junk:5", 16)));
  ASSERT_FALSE(info.isOk());
  EXPECT_EQ(info.status().code(), ErrorCode::kInvalidArgument);
}

TEST(SocketAddress, NumericParseRefusesNamesAndNul) {
  EXPECT_TRUE(tcp::SocketAddress::parseNumeric("127.0.0.1:80").isOk());
  EXPECT_TRUE(tcp::SocketAddress::parseNumeric("[::1]:80").isOk());
  EXPECT_FALSE(tcp::SocketAddress::parseNumeric("localhost:80").isOk());
  EXPECT_FALSE(tcp::SocketAddress::parse(std::string("127.0.0.1\0x:80", 14)).isOk());
  EXPECT_TRUE(tcp::SocketAddress::parse("localhost:80").isOk()) << "BRAID_ADDR may name a host";
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

TEST(Deadline, AFlagEndsItAtOnceAndBoundsEachWait) {
  std::atomic<bool> flag{false};
  const Deadline deadline = Deadline::after(60).endedBy(&flag);
  EXPECT_FALSE(deadline.expired());
  EXPECT_LE(deadline.remainingMs(1000), Deadline::kFlagCheckMs);
  EXPECT_LE(deadline.within(10).remainingMs(1000), Deadline::kFlagCheckMs)
      << "within() keeps the flag";
  EXPECT_GT(Deadline::after(60).remainingMs(1000), 900) << "without a flag, waits as asked";
  flag = true;
  EXPECT_TRUE(deadline.expired());
  EXPECT_TRUE(deadline.within(10).expired());
  EXPECT_EQ(deadline.remainingMs(1000), 0);
}

// A split's init waits for the other ranks of the new communicator, one of
// which may never come; an abort of the parent ends it as it ends any call
// on the parent (Communicator::split hands create its abort flag). Last in
// this file: its rendezvous server still waits for the missing rank.
TEST(CommunicatorInit, AnAbortFlagEndsAnInitThatWaitsForARankThatNeverJoins) {
  auto info = startOnLoopback(0x3c);
  ASSERT_TRUE(info.isOk()) << info.status().message();
  auto config = loadConfig();
  ASSERT_TRUE(config.isOk()) << config.status().message();
  config->timeoutSeconds = 20;
  std::atomic<bool> aborted{false};
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    aborted = true;
  });
  const auto start = std::chrono::steady_clock::now();
  auto created = Communicator::create(*info, 2, 0, *config, nullptr, &aborted);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  aborter.join();
  EXPECT_FALSE(created.isOk()) << "rank 1 never joined";
  EXPECT_LT(seconds, 2.0) << created.status().message();
}

}  // namespace
}  // namespace braid
