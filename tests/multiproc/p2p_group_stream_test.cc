// Point-to-point calls in groups and host streams on real processes, the
// same bodies again with BRAID_DEBUG=TRACE, and communicators made from
// launcher variables. Failures are in failures_test.cc.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "harness.h"
#include "reference.h"

namespace braidtest {
namespace {

constexpr std::chrono::seconds kTimeout{120};

std::string where(const char* what, braidDataType_t t, size_t count, int n) {
  return std::string(what) + " " + typeInfo(t).name + " count=" + std::to_string(count) +
         " nranks=" + std::to_string(n);
}

void expectCopy(const std::string& desc, braidDataType_t t, const void* got, size_t count,
                uint64_t seed, int fromRank, size_t firstIndex = 0) {
  std::string m = compareWith(t, got, count, [&](size_t i) {
    return Expected{inputValue(t, Kind::kCopy, seed, fromRank, firstIndex + i), 0};
  });
  RANK_EXPECT_TRUE(m.empty()) << desc << ": " << m;
}

// Every rank sends to rank+1 and receives from rank-1 inside one group (a
// self-send when nranks == 1), then both ways at once, then a full exchange
// of Send/Recv pairs, then blocking pairs outside a group.
void ringBody(RankContext& ctx) {
  int n = ctx.nranks, me = ctx.rank, next = (me + 1) % n, prev = (me + n - 1) % n;
  uint64_t seed = 1000;
  for (braidDataType_t t : {braidInt8, braidFloat16, braidFloat32, braidInt64, braidFloat64}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{65537}}) {
      std::string desc = where("ring", t, count, n);
      ctx.step(desc);
      ++seed;
      GuardedBuffer send(t, count), recv(t, count);
      fillInput(t, Kind::kCopy, seed, me, send.data(), count);
      auto orig = send.snapshot();
      RANK_ASSERT_OK(braidGroupStart());
      RANK_ASSERT_OK(braidSend(send.data(), count, t, next, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidRecv(recv.data(), count, t, prev, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidGroupEnd()) << desc;
      expectCopy(desc, t, recv.data(), count, seed, prev);
      RANK_EXPECT_TRUE(send.equals(orig)) << desc << ": sendbuff modified";
      RANK_EXPECT_TRUE(send.guardsIntact() && recv.guardsIntact())
          << desc << ": guard bytes overwritten";

      // Both directions: to next then to prev; receive from prev then next.
      desc = where("bidirectional ring", t, count, n);
      ctx.step(desc);
      uint64_t seedNext = ++seed, seedPrev = ++seed;
      GuardedBuffer toNext(t, count), toPrev(t, count), fromPrev(t, count), fromNext(t, count);
      fillInput(t, Kind::kCopy, seedNext, me, toNext.data(), count);
      fillInput(t, Kind::kCopy, seedPrev, me, toPrev.data(), count);
      RANK_ASSERT_OK(braidGroupStart());
      RANK_ASSERT_OK(braidSend(toNext.data(), count, t, next, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidSend(toPrev.data(), count, t, prev, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidRecv(fromPrev.data(), count, t, prev, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidRecv(fromNext.data(), count, t, next, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidGroupEnd()) << desc;
      expectCopy(desc + " (from prev)", t, fromPrev.data(), count, seedNext, prev);
      expectCopy(desc + " (from next)", t, fromNext.data(), count, seedPrev, next);
    }
  }
  for (size_t count : {size_t{1}, size_t{4099}}) {
    braidDataType_t t = braidUint32;
    std::string desc = where("all-to-all of Send/Recv in a nested group", t, count, n);
    ctx.step(desc);
    ++seed;
    size_t total = count * n;
    GuardedBuffer send(t, total), recv(t, total);
    fillInput(t, Kind::kCopy, seed, me, send.data(), total);
    RANK_ASSERT_OK(braidGroupStart());
    for (int p = 0; p < n; ++p) {
      RANK_ASSERT_OK(braidGroupStart());
      RANK_ASSERT_OK(braidSend(send.bytes() + p * count * 4, count, t, p, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidRecv(recv.bytes() + p * count * 4, count, t, p, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidGroupEnd());
    }
    RANK_ASSERT_OK(braidGroupEnd()) << desc;
    for (int p = 0; p < n; ++p)
      expectCopy(desc + " part " + std::to_string(p), t, recv.bytes() + p * count * 4, count, seed,
                 p, me * count);
  }
  // Blocking pairs (0,1), (2,3), ... outside any group.
  int partner = me ^ 1;
  if (partner < n) {
    braidDataType_t t = braidFloat64;
    size_t count = 3000;
    std::string desc = where("blocking Send/Recv pair", t, count, n);
    ctx.step(desc);
    ++seed;
    GuardedBuffer send(t, count), recv(t, count);
    fillInput(t, Kind::kCopy, seed, me, send.data(), count);
    if (me % 2 == 0) {
      RANK_ASSERT_OK(braidSend(send.data(), count, t, partner, ctx.comm, nullptr)) << desc;
      RANK_ASSERT_OK(braidRecv(recv.data(), count, t, partner, ctx.comm, nullptr)) << desc;
    } else {
      RANK_ASSERT_OK(braidRecv(recv.data(), count, t, partner, ctx.comm, nullptr)) << desc;
      RANK_ASSERT_OK(braidSend(send.data(), count, t, partner, ctx.comm, nullptr)) << desc;
    }
    expectCopy(desc, t, recv.data(), count, seed, partner);
  }
  ctx.step("final barrier");
  RANK_ASSERT_OK(braidBarrier(ctx.comm, nullptr));
}

// Queues an ordered sequence on `stream`: x = rank + 1 + salt; x = sum(x);
// x = prod(x) (so x = S^n, which differs if the two run out of order);
// then a broadcast from the last rank of a value only it has.
struct Sequence {
  std::vector<int64_t> x, b;
  int64_t salt;
  void enqueue(RankContext& ctx, braidStream_t s) {
    x.assign(16, ctx.rank + 1 + salt);
    b.assign(16, ctx.rank == ctx.nranks - 1 ? 4242 + salt : -1);
    RANK_ASSERT_OK(braidAllReduce(x.data(), x.data(), x.size(), braidInt64, braidSum, ctx.comm, s));
    RANK_ASSERT_OK(
        braidAllReduce(x.data(), x.data(), x.size(), braidInt64, braidProd, ctx.comm, s));
    RANK_ASSERT_OK(
        braidBroadcast(b.data(), b.data(), b.size(), braidInt64, ctx.nranks - 1, ctx.comm, s));
  }
  void check(RankContext& ctx) {
    int n = ctx.nranks;
    uint64_t sum = 0, pow = 1;
    for (int r = 0; r < n; ++r) sum += static_cast<uint64_t>(r + 1 + salt);
    for (int r = 0; r < n; ++r) pow *= sum;
    for (size_t i = 0; i < x.size(); ++i)
      RANK_EXPECT_EQ(x[i], static_cast<int64_t>(pow)) << "salt " << salt;
    for (size_t i = 0; i < b.size(); ++i) RANK_EXPECT_EQ(b[i], 4242 + salt) << "salt " << salt;
  }
};

void streamBody(RankContext& ctx) {
  int n = ctx.nranks;
  ctx.step("braidStreamCreate");
  braidStream_t s = nullptr;
  RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &s));
  RANK_ASSERT_TRUE(s != nullptr);

  ctx.step("8 AllReduces queued on one stream");
  constexpr int kCalls = 8;
  constexpr size_t kCount = 50000;
  std::vector<std::vector<float>> in(kCalls), out(kCalls);
  for (int k = 0; k < kCalls; ++k) {
    in[k].assign(kCount, static_cast<float>(ctx.rank * (k + 1)));
    out[k].assign(kCount, -1.f);
    RANK_ASSERT_OK(
        braidAllReduce(in[k].data(), out[k].data(), kCount, braidFloat32, braidSum, ctx.comm, s));
  }
  braidResult_t q = braidStreamQuery(s);
  RANK_EXPECT_TRUE(q == braidSuccess || q == braidInProgress)
      << describeResult(q, "braidStreamQuery");
  RANK_ASSERT_OK(braidStreamSynchronize(s));
  RANK_EXPECT_EQ(braidStreamQuery(s), braidSuccess);
  for (int k = 0; k < kCalls; ++k) {
    float expect = static_cast<float>((k + 1) * n * (n - 1) / 2);
    RANK_EXPECT_TRUE(
        std::all_of(out[k].begin(), out[k].end(), [&](float v) { return v == expect; }))
        << "stream AllReduce " << k << ": expected " << expect << " everywhere, first is "
        << out[k][0];
    RANK_EXPECT_TRUE(
        std::all_of(in[k].begin(), in[k].end(),
                    [&](float v) { return v == static_cast<float>(ctx.rank * (k + 1)); }))
        << "stream AllReduce " << k << " modified sendbuff";
  }

  ctx.step("ordered sequence on one stream");
  Sequence one{{}, {}, 0};
  one.enqueue(ctx, s);
  RANK_ASSERT_OK(braidStreamSynchronize(s));
  one.check(ctx);

  ctx.step("two streams, each with an ordered sequence");
  braidStream_t s2 = nullptr;
  RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &s2));
  Sequence a{{}, {}, 1}, b{{}, {}, 2};
  a.enqueue(ctx, s);
  b.enqueue(ctx, s2);
  RANK_ASSERT_OK(braidStreamSynchronize(s2));
  RANK_ASSERT_OK(braidStreamSynchronize(s));
  a.check(ctx);
  b.check(ctx);
  braidResult_t async = braidInternalError;
  RANK_ASSERT_OK(braidCommGetAsyncError(ctx.comm, &async));
  RANK_EXPECT_EQ(async, braidSuccess);

  ctx.step("Send/Recv ring on a stream inside a group");
  std::vector<int32_t> ringSend(777, ctx.rank), ringRecv(777, -1);
  RANK_ASSERT_OK(braidGroupStart());
  RANK_ASSERT_OK(
      braidSend(ringSend.data(), ringSend.size(), braidInt32, (ctx.rank + 1) % n, ctx.comm, s2));
  RANK_ASSERT_OK(braidRecv(ringRecv.data(), ringRecv.size(), braidInt32, (ctx.rank + n - 1) % n,
                           ctx.comm, s2));
  RANK_ASSERT_OK(braidGroupEnd());
  RANK_ASSERT_OK(braidStreamSynchronize(s2));
  RANK_EXPECT_EQ(ringRecv[0], (ctx.rank + n - 1) % n);
  RANK_EXPECT_EQ(ringRecv.back(), (ctx.rank + n - 1) % n);

  ctx.step("braidStreamDestroy with queued work");
  Sequence c{{}, {}, 3};
  c.enqueue(ctx, s2);
  RANK_ASSERT_OK(braidStreamDestroy(s2));  // waits for the queued calls
  c.check(ctx);
  RANK_ASSERT_OK(braidStreamDestroy(s));
  ctx.step("final barrier");
  RANK_ASSERT_OK(braidBarrier(ctx.comm, nullptr));
}

std::string sizeName(const ::testing::TestParamInfo<int>& info) {
  std::string name = "n";
  return name += std::to_string(info.param);
}

class PointToPoint : public ::testing::TestWithParam<int> {};
TEST_P(PointToPoint, RingInGroups) {
  runRanks(GetParam(), ringBody, kTimeout);
}
INSTANTIATE_TEST_SUITE_P(WorldSize, PointToPoint, ::testing::Values(1, 2, 3, 5, 8), sizeName);

// With a 4 KiB chunk the large messages of the ring cross in eight pieces of
// whole elements and a ninth of the rest (65537 elements of 8 bytes: eight
// of 65536 bytes and one of 8), several to one peer in a group: every byte
// must land where a whole message would have put it.
class PointToPointInPieces : public ::testing::TestWithParam<int> {};
TEST_P(PointToPointInPieces, RingInGroups) {
  RunOptions options;
  options.env = {{"BRAID_CHUNK_BYTES", "4096"}};
  runRanks(GetParam(), ringBody, kTimeout, options);
}
INSTANTIATE_TEST_SUITE_P(WorldSize, PointToPointInPieces, ::testing::Values(2, 3, 5), sizeName);

// A group of one call is that call, whether or not the other ranks group
// it (as NCCL's groups only batch): ranks alternate between the two, over
// sizes that the one-host board serves and sizes it leaves to the
// algorithms, and with algorithms measured (BRAID_TUNE=measure), where a
// rank whose group skipped the trials reduced other blocks than its peers.
void groupOfOneBody(RankContext& ctx) {
  const int n = ctx.nranks, me = ctx.rank;
  const bool grouped = me % 2 == 0;
  auto call = [&](const std::string& what, auto&& submit) {
    ctx.step(what + (grouped ? " in a group" : " alone"));
    if (grouped) RANK_ASSERT_OK(braidGroupStart());
    RANK_ASSERT_OK(submit()) << what;
    if (grouped) RANK_ASSERT_OK(braidGroupEnd()) << what;
  };
  for (int round = 0; round < 12; ++round)
    for (size_t count : {size_t{16}, size_t{4096}, size_t{262144}}) {
      std::vector<int32_t> send(count), recv(count, -1);
      for (size_t i = 0; i < count; ++i) send[i] = static_cast<int32_t>(me + 1 + i);
      const std::string what = "AllReduce of " + std::to_string(count);
      call(what, [&] {
        return braidAllReduce(send.data(), recv.data(), count, braidInt32, braidSum, ctx.comm,
                              nullptr);
      });
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i)
        wrong += recv[i] != static_cast<int32_t>(n * (n + 1) / 2 + n * i);
      RANK_ASSERT_EQ(wrong, 0u) << what << ", round " << round;
      std::vector<int32_t> root(count, me == 1 % n ? 7 : 0);
      call("Broadcast of " + std::to_string(count), [&] {
        return braidBroadcast(root.data(), root.data(), count, braidInt32, 1 % n, ctx.comm,
                              nullptr);
      });
      RANK_ASSERT_TRUE(std::all_of(root.begin(), root.end(), [](int32_t v) { return v == 7; }));
      call("Barrier", [&] { return braidBarrier(ctx.comm, nullptr); });
    }
}

// One collective grouped with point-to-point calls on some ranks and
// alone on others (a rank with nothing to send): the collective meets
// itself, and the point-to-point calls complete.
void collectiveWithPointToPointBody(RankContext& ctx) {
  const int n = ctx.nranks, me = ctx.rank;
  const bool pairs = n >= 2 && me < 2;  // ranks 0 and 1 also exchange
  for (size_t count : {size_t{16}, size_t{262144}}) {
    std::vector<int32_t> send(count), recv(count, -1), mine(count, me), theirs(count, -1);
    for (size_t i = 0; i < count; ++i) send[i] = static_cast<int32_t>(me + 1 + i);
    ctx.step("AllReduce of " + std::to_string(count) + (pairs ? " with a Send and a Recv" : ""));
    RANK_ASSERT_OK(braidGroupStart());
    RANK_ASSERT_OK(
        braidAllReduce(send.data(), recv.data(), count, braidInt32, braidSum, ctx.comm, nullptr));
    if (pairs) {
      RANK_ASSERT_OK(braidSend(mine.data(), count, braidInt32, 1 - me, ctx.comm, nullptr));
      RANK_ASSERT_OK(braidRecv(theirs.data(), count, braidInt32, 1 - me, ctx.comm, nullptr));
    }
    RANK_ASSERT_OK(braidGroupEnd());
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i)
      wrong += recv[i] != static_cast<int32_t>(n * (n + 1) / 2 + n * i);
    RANK_ASSERT_EQ(wrong, 0u) << "AllReduce of " << count;
    if (pairs)
      RANK_ASSERT_TRUE(std::all_of(theirs.begin(), theirs.end(),
                                   [&](int32_t v) { return v == 1 - me; }));
  }
}

class GroupOfOne : public ::testing::TestWithParam<int> {};
TEST_P(GroupOfOne, MeetsTheSameCollectiveGroupedWithPointToPoint) {
  runRanks(GetParam(), collectiveWithPointToPointBody, kTimeout);
}
TEST_P(GroupOfOne, MeetsTheSameCallMadeAlone) {
  runRanks(GetParam(), groupOfOneBody, kTimeout);
}
TEST_P(GroupOfOne, MeetsTheSameCallMadeAloneWhileAlgorithmsAreMeasured) {
  RunOptions options;
  options.env = {{"BRAID_TUNE", "measure"}};
  runRanks(GetParam(), groupOfOneBody, kTimeout, options);
}
INSTANTIATE_TEST_SUITE_P(WorldSize, GroupOfOne, ::testing::Values(2, 3), sizeName);

class Streams : public ::testing::TestWithParam<int> {};
TEST_P(Streams, OrderedAndConcurrent) {
  runRanks(GetParam(), streamBody, kTimeout);
}
INSTANTIATE_TEST_SUITE_P(WorldSize, Streams, ::testing::Values(1, 2, 3, 5, 8), sizeName);

// braidCommDestroy waits for the calls still queued on the streams of the
// communicator, then frees them too.
TEST(Streams, CommDestroyWaitsForQueuedCalls) {
  runRanks(
      3,
      [](RankContext& ctx) {
        braidStream_t s = nullptr;
        RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &s));
        Sequence seq{{}, {}, 5};
        seq.enqueue(ctx, s);
        RANK_ASSERT_OK(braidCommDestroy(ctx.comm));
        ctx.comm = nullptr;  // destroyed here, not by the harness
        seq.check(ctx);
      },
      kTimeout);
}

TEST(Trace, EverythingWorksWithDebugTrace) {
  RunOptions options;
  options.env = {{"BRAID_DEBUG", "TRACE"}};
  runRanks(
      2,
      [](RankContext& ctx) {
        std::vector<float> x(1000, 1.f);
        RANK_ASSERT_OK(braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum,
                                      ctx.comm, nullptr));
        RANK_EXPECT_EQ(x[999], 2.f);
        ringBody(ctx);
        streamBody(ctx);
      },
      kTimeout, options);
}

// ---- braidCommInitFromEnv ---------------------------------------------------

int freeLocalPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    ADD_FAILURE() << "no free port";
  ::close(fd);
  return ntohs(a.sin_port);
}

void initFromEnv(const char* rankVariable, std::vector<std::pair<std::string, std::string>> env) {
  RunOptions options;
  options.createId = false;
  options.env = std::move(env);
  runRanks(
      3,
      [&](RankContext& ctx) {
        ::setenv(rankVariable, std::to_string(ctx.rank).c_str(), 1);
        RANK_ASSERT_OK(braidCommInitFromEnv(&ctx.comm));
        int count = -1, rank = -1;
        RANK_ASSERT_OK(braidCommCount(ctx.comm, &count));
        RANK_ASSERT_OK(braidCommUserRank(ctx.comm, &rank));
        RANK_EXPECT_EQ(count, 3);
        RANK_EXPECT_EQ(rank, ctx.rank);
        int32_t mine = ctx.rank + 1, sum = 0;
        RANK_ASSERT_OK(braidAllReduce(&mine, &sum, 1, braidInt32, braidSum, ctx.comm, nullptr));
        RANK_EXPECT_EQ(sum, 6);
      },
      kTimeout, options);
}

TEST(InitFromEnv, BraidVariablesWithSecret) {
  initFromEnv("BRAID_RANK", {{"BRAID_WORLD_SIZE", "3"},
                             {"BRAID_ADDR", "127.0.0.1:" + std::to_string(freeLocalPort())},
                             {"BRAID_SECRET", "0123456789abcdef0123456789ABCDEF"}});
}

// A socket listening on 127.0.0.1:`port`, or none (-1) where the port is taken.
int listenOn(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::listen(fd, 16) == 0)
    return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

// MASTER_PORT is torch.distributed's: torchrun's agent serves its store
// there (torch 2.4 and later), as does a program's own env:// init on rank
// 0. braid's rank 0 listens on the port after it; it failed with "address
// already in use" on the taken one.
TEST(InitFromEnv, TorchrunVariablesLeaveMasterPortToTorch) {
  int port = 0, taken = -1;
  for (int attempt = 0; attempt < 20 && taken < 0; ++attempt) {
    port = freeLocalPort();
    const int next = listenOn(port + 1);  // free too?
    if (next < 0) continue;
    ::close(next);
    taken = listenOn(port);
  }
  ASSERT_GE(taken, 0) << "no two free ports in a row";
  initFromEnv(
      "RANK",
      {{"WORLD_SIZE", "3"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}});
  ::close(taken);
}

}  // namespace
}  // namespace braidtest
