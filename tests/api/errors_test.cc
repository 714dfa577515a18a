// Every bad argument of the C ABI returns the documented braidResult_t, and
// braidGetLastError() names the call and the argument. Calls that need a
// communicator use a 1-rank one, which needs no other process.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "braid.h"
#include "expect_braid.h"

namespace {

using braid_api_test::mentions;

braidComm_t newComm() {
  braidUniqueId id;
  braidComm_t c = nullptr;
  EXPECT_BRAID_OK(braidGetUniqueId(&id));
  EXPECT_BRAID_OK(braidCommInitRank(&c, 1, id, 0));
  return c;
}

// A 1-rank communicator shared by the tests of one suite.
class WithComm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { comm_ = newComm(); }
  static void TearDownTestSuite() {
    EXPECT_BRAID_OK(braidCommDestroy(comm_));
    comm_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(comm_, nullptr) << "no 1-rank communicator"; }
  static braidComm_t comm_;
  float a_[64] = {};
  float b_[64] = {};
};
braidComm_t WithComm::comm_ = nullptr;

TEST(Library, ErrorStringsAreDistinctAndNonEmpty) {
  std::set<std::string> seen;
  for (int r = braidSuccess; r <= braidNotSupported; ++r) {
    const char* s = braidGetErrorString(static_cast<braidResult_t>(r));
    ASSERT_NE(s, nullptr) << r;
    EXPECT_GT(std::strlen(s), 0u) << r;
    EXPECT_TRUE(seen.insert(s).second) << "duplicate name \"" << s << "\" for " << r;
  }
  EXPECT_NE(braidGetErrorString(static_cast<braidResult_t>(77)), nullptr);
}

TEST(Library, VersionAndNullOutPointers) {
  int v = -1;
  EXPECT_BRAID_OK(braidGetVersion(&v));
  EXPECT_EQ(v, BRAID_VERSION_CODE);
  EXPECT_NE(braidGetLastError(nullptr), nullptr);
  braidResult_t r = braidGetVersion(nullptr);
  EXPECT_EQ(r, braidInvalidArgument);
  EXPECT_TRUE(mentions(braidGetLastError(nullptr), "braidGetVersion"))
      << braidGetLastError(nullptr);
  EXPECT_TRUE(mentions(braidGetLastError(nullptr), "version")) << braidGetLastError(nullptr);
  EXPECT_BRAID_ERROR(braidGetUniqueId(nullptr), braidInvalidArgument, "braidGetUniqueId",
                     "uniqueId");
  EXPECT_BRAID_ERROR(braidCommInitFromEnv(nullptr), braidInvalidArgument, "braidCommInitFromEnv",
                     "comm");
}

TEST(Library, UnbalancedGroupEnd) {
  EXPECT_BRAID_ERROR(braidGroupEnd(), braidInvalidUsage, "braidGroupEnd");
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(braidGroupEnd());
  EXPECT_BRAID_ERROR(braidGroupEnd(), braidInvalidUsage, "braidGroupEnd");
}

TEST(Library, NullStreams) {
  EXPECT_BRAID_ERROR(braidStreamSynchronize(nullptr), braidInvalidArgument,
                     "braidStreamSynchronize", "stream");
  EXPECT_BRAID_ERROR(braidStreamQuery(nullptr), braidInvalidArgument, "braidStreamQuery", "stream");
  EXPECT_BRAID_OK(braidStreamDestroy(nullptr));
  EXPECT_BRAID_OK(braidCommDestroy(nullptr));
}

// This process loads no CUDA driver (and the build may have no CUDA): GPU
// memory is refused with a reason, never a crash.
TEST(Library, MemAllocChecksItsArgumentsAndNeedsTheCudaDriver) {
  void* p = nullptr;
  EXPECT_EQ(braidMemAlloc(nullptr, 64), braidInvalidArgument);
  EXPECT_EQ(braidMemAlloc(&p, 0), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError(nullptr)).find("size is 0"), std::string::npos);
  EXPECT_EQ(braidMemAlloc(&p, 64), braidNotSupported);
  const std::string why = braidGetLastError(nullptr);
  EXPECT_TRUE(why.find("CUDA driver") != std::string::npos ||
              why.find("host memory only") != std::string::npos)
      << why;
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(braidMemFree(nullptr), braidSuccess);
  int onTheStack = 0;
  EXPECT_EQ(braidMemFree(&onTheStack), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError(nullptr)).find("braidMemAlloc did not return"),
            std::string::npos);
}

TEST(Library, NullCommForEveryCall) {
  braidComm_t out = nullptr;
  braidStream_t s = nullptr;
  int i = 0;
  braidResult_t async = braidSuccess;
  float x = 0;
  EXPECT_BRAID_ERROR(braidCommSplit(nullptr, 0, 0, &out), braidInvalidArgument, "braidCommSplit",
                     "comm");
  EXPECT_BRAID_ERROR(braidCommGetAsyncError(nullptr, &async), braidInvalidArgument,
                     "braidCommGetAsyncError", "comm");
  EXPECT_BRAID_ERROR(braidCommCount(nullptr, &i), braidInvalidArgument, "braidCommCount", "comm");
  EXPECT_BRAID_ERROR(braidCommUserRank(nullptr, &i), braidInvalidArgument, "braidCommUserRank",
                     "comm");
  EXPECT_BRAID_ERROR(braidAllReduce(&x, &x, 1, braidFloat32, braidSum, nullptr, nullptr),
                     braidInvalidArgument, "braidAllReduce", "comm");
  EXPECT_BRAID_ERROR(braidBroadcast(&x, &x, 1, braidFloat32, 0, nullptr, nullptr),
                     braidInvalidArgument, "braidBroadcast", "comm");
  EXPECT_BRAID_ERROR(braidReduce(&x, &x, 1, braidFloat32, braidSum, 0, nullptr, nullptr),
                     braidInvalidArgument, "braidReduce", "comm");
  EXPECT_BRAID_ERROR(braidAllGather(&x, &x, 1, braidFloat32, nullptr, nullptr),
                     braidInvalidArgument, "braidAllGather", "comm");
  EXPECT_BRAID_ERROR(braidReduceScatter(&x, &x, 1, braidFloat32, braidSum, nullptr, nullptr),
                     braidInvalidArgument, "braidReduceScatter", "comm");
  EXPECT_BRAID_ERROR(braidAllToAll(&x, &i, 1, braidFloat32, nullptr, nullptr), braidInvalidArgument,
                     "braidAllToAll", "comm");
  EXPECT_BRAID_ERROR(braidGather(&x, &x, 1, braidFloat32, 0, nullptr, nullptr),
                     braidInvalidArgument, "braidGather", "comm");
  EXPECT_BRAID_ERROR(braidScatter(&x, &x, 1, braidFloat32, 0, nullptr, nullptr),
                     braidInvalidArgument, "braidScatter", "comm");
  EXPECT_BRAID_ERROR(braidBarrier(nullptr, nullptr), braidInvalidArgument, "braidBarrier", "comm");
  EXPECT_BRAID_ERROR(braidSend(&x, 1, braidFloat32, 0, nullptr, nullptr), braidInvalidArgument,
                     "braidSend", "comm");
  EXPECT_BRAID_ERROR(braidRecv(&x, 1, braidFloat32, 0, nullptr, nullptr), braidInvalidArgument,
                     "braidRecv", "comm");
  EXPECT_BRAID_ERROR(braidStreamCreate(nullptr, &s), braidInvalidArgument, "braidStreamCreate",
                     "comm");
  void* handle = nullptr;
  EXPECT_BRAID_ERROR(braidCommRegister(nullptr, &x, sizeof(x), &handle), braidInvalidArgument,
                     "braidCommRegister", "comm");
  EXPECT_BRAID_ERROR(braidCommDeregister(nullptr, &x), braidInvalidArgument, "braidCommDeregister",
                     "comm");
  // A build without CUDA may refuse before looking at the arguments.
  braidResult_t r = braidStreamCreateFromCuda(nullptr, nullptr, &s);
  EXPECT_TRUE(r == braidInvalidArgument || r == braidNotSupported) << braidGetLastError(nullptr);
  EXPECT_TRUE(mentions(braidGetLastError(nullptr), "braidStreamCreateFromCuda"))
      << braidGetLastError(nullptr);
  // braidCommAbort(NULL): nothing to abort; either answer is reasonable.
  r = braidCommAbort(nullptr);
  EXPECT_TRUE(r == braidSuccess || r == braidInvalidArgument) << braidGetLastError(nullptr);
}

TEST(CommInit, BadArguments) {
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess) << braidGetLastError(nullptr);
  braidComm_t c = nullptr;
  EXPECT_BRAID_ERROR(braidCommInitRank(nullptr, 1, id, 0), braidInvalidArgument,
                     "braidCommInitRank", "comm");
  EXPECT_BRAID_ERROR(braidCommInitRank(&c, 0, id, 0), braidInvalidArgument, "braidCommInitRank",
                     "nranks");
  EXPECT_BRAID_ERROR(braidCommInitRank(&c, -3, id, 0), braidInvalidArgument, "braidCommInitRank",
                     "nranks");
  EXPECT_BRAID_ERROR(braidCommInitRank(&c, 1, id, -1), braidInvalidArgument, "braidCommInitRank",
                     "rank");
  EXPECT_BRAID_ERROR(braidCommInitRank(&c, 1, id, 1), braidInvalidArgument, "braidCommInitRank",
                     "rank");
  EXPECT_BRAID_ERROR(braidCommInitRank(&c, 4, id, 4), braidInvalidArgument, "braidCommInitRank",
                     "rank");
  // The rejected calls used nothing up: the id still makes a communicator.
  EXPECT_BRAID_OK(braidCommInitRank(&c, 1, id, 0));
  ASSERT_NE(c, nullptr);
  int count = 0, rank = -1;
  EXPECT_BRAID_OK(braidCommCount(c, &count));
  EXPECT_BRAID_OK(braidCommUserRank(c, &rank));
  EXPECT_EQ(count, 1);
  EXPECT_EQ(rank, 0);
  EXPECT_BRAID_OK(braidCommDestroy(c));
}

TEST(CommInit, GarbageUniqueIdFailsQuickly) {
  std::mt19937_64 rng(12345);
  for (int trial = 0; trial < 3; ++trial) {
    braidUniqueId id;
    for (char& ch : id.internal) ch = static_cast<char>(rng());
    braidComm_t c = nullptr;
    auto start = std::chrono::steady_clock::now();
    EXPECT_BRAID_ERROR(braidCommInitRank(&c, 2, id, 1), braidInvalidArgument, "braidCommInitRank");
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(s, 5.0) << "rejecting a malformed id took " << s << " s";
    EXPECT_EQ(c, nullptr);
  }
}

TEST(CommInit, UnknownAndMalformedEnvironment) {
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess) << braidGetLastError(nullptr);
  braidComm_t c = nullptr;
  ::setenv("BRAID_BOGUS", "1", 1);
  EXPECT_BRAID_ERROR(braidCommInitRank(&c, 1, id, 0), braidInvalidArgument, "braidCommInitRank",
                     "BRAID_BOGUS");
  ::unsetenv("BRAID_BOGUS");
  ::setenv("BRAID_TIMEOUT", "abc", 1);
  EXPECT_BRAID_ERROR(braidCommInitRank(&c, 1, id, 0), braidInvalidArgument, "braidCommInitRank",
                     "BRAID_TIMEOUT");
  ::unsetenv("BRAID_TIMEOUT");
  // With the environment clean again the same id still works.
  EXPECT_BRAID_OK(braidCommInitRank(&c, 1, id, 0));
  EXPECT_BRAID_OK(braidCommDestroy(c));
}

// Declaring buffers (braidCommRegister): refused arguments, and a handle
// that ends its declaration once. A declared buffer serves calls as any.
TEST_F(WithComm, RegisterAndDeregister) {
  void* handle = nullptr;
  EXPECT_BRAID_ERROR(braidCommRegister(comm_, nullptr, 64, &handle), braidInvalidArgument,
                     "braidCommRegister", "null");
  EXPECT_BRAID_ERROR(braidCommRegister(comm_, a_, 0, &handle), braidInvalidArgument,
                     "braidCommRegister", "0 bytes");
  EXPECT_BRAID_ERROR(braidCommRegister(comm_, a_, sizeof(a_), nullptr), braidInvalidArgument,
                     "braidCommRegister", "handle");
  EXPECT_BRAID_ERROR(braidCommDeregister(comm_, nullptr), braidInvalidArgument,
                     "braidCommDeregister", "handle");
  EXPECT_BRAID_OK(braidCommRegister(comm_, a_, sizeof(a_), &handle));
  ASSERT_NE(handle, nullptr);
  a_[0] = 3;
  EXPECT_BRAID_OK(braidAllReduce(a_, b_, 64, braidFloat32, braidSum, comm_, nullptr));
  EXPECT_EQ(b_[0], 3);
  EXPECT_BRAID_OK(braidCommDeregister(comm_, handle));
  EXPECT_BRAID_ERROR(braidCommDeregister(comm_, handle), braidInvalidArgument,
                     "braidCommDeregister", "not a registered buffer");
}

TEST_F(WithComm, NullOutPointers) {
  EXPECT_BRAID_ERROR(braidCommCount(comm_, nullptr), braidInvalidArgument, "braidCommCount",
                     "count");
  EXPECT_BRAID_ERROR(braidCommUserRank(comm_, nullptr), braidInvalidArgument, "braidCommUserRank",
                     "rank");
  EXPECT_BRAID_ERROR(braidCommSplit(comm_, 0, 0, nullptr), braidInvalidArgument, "braidCommSplit",
                     "newcomm");
  EXPECT_BRAID_ERROR(braidStreamCreate(comm_, nullptr), braidInvalidArgument, "braidStreamCreate",
                     "stream");
  EXPECT_BRAID_ERROR(braidCommGetAsyncError(comm_, nullptr), braidInvalidArgument,
                     "braidCommGetAsyncError", "asyncError");
}

TEST_F(WithComm, BadDatatype) {
  for (int bad : {static_cast<int>(braidNumTypes), -1}) {
    auto t = static_cast<braidDataType_t>(bad);
    SCOPED_TRACE("datatype " + std::to_string(bad));
    EXPECT_BRAID_ERROR(braidAllReduce(a_, b_, 4, t, braidSum, comm_, nullptr), braidInvalidArgument,
                       "braidAllReduce", "datatype");
    EXPECT_BRAID_ERROR(braidBroadcast(a_, b_, 4, t, 0, comm_, nullptr), braidInvalidArgument,
                       "braidBroadcast", "datatype");
    EXPECT_BRAID_ERROR(braidReduce(a_, b_, 4, t, braidSum, 0, comm_, nullptr), braidInvalidArgument,
                       "braidReduce", "datatype");
    EXPECT_BRAID_ERROR(braidAllGather(a_, b_, 4, t, comm_, nullptr), braidInvalidArgument,
                       "braidAllGather", "datatype");
    EXPECT_BRAID_ERROR(braidReduceScatter(a_, b_, 4, t, braidSum, comm_, nullptr),
                       braidInvalidArgument, "braidReduceScatter", "datatype");
    EXPECT_BRAID_ERROR(braidAllToAll(a_, b_, 4, t, comm_, nullptr), braidInvalidArgument,
                       "braidAllToAll", "datatype");
    EXPECT_BRAID_ERROR(braidGather(a_, b_, 4, t, 0, comm_, nullptr), braidInvalidArgument,
                       "braidGather", "datatype");
    EXPECT_BRAID_ERROR(braidScatter(a_, b_, 4, t, 0, comm_, nullptr), braidInvalidArgument,
                       "braidScatter", "datatype");
    EXPECT_BRAID_ERROR(braidSend(a_, 4, t, 0, comm_, nullptr), braidInvalidArgument, "braidSend",
                       "datatype");
    EXPECT_BRAID_ERROR(braidRecv(b_, 4, t, 0, comm_, nullptr), braidInvalidArgument, "braidRecv",
                       "datatype");
  }
}

TEST_F(WithComm, BadOp) {
  for (int bad : {static_cast<int>(braidNumOps), -1}) {
    auto op = static_cast<braidRedOp_t>(bad);
    SCOPED_TRACE("op " + std::to_string(bad));
    EXPECT_BRAID_ERROR(braidAllReduce(a_, b_, 4, braidFloat32, op, comm_, nullptr),
                       braidInvalidArgument, "braidAllReduce", "op");
    EXPECT_BRAID_ERROR(braidReduce(a_, b_, 4, braidFloat32, op, 0, comm_, nullptr),
                       braidInvalidArgument, "braidReduce", "op");
    EXPECT_BRAID_ERROR(braidReduceScatter(a_, b_, 4, braidFloat32, op, comm_, nullptr),
                       braidInvalidArgument, "braidReduceScatter", "op");
  }
}

TEST_F(WithComm, BadRoot) {
  for (int root : {-1, 1}) {  // nranks == 1
    SCOPED_TRACE("root " + std::to_string(root));
    EXPECT_BRAID_ERROR(braidBroadcast(a_, b_, 4, braidFloat32, root, comm_, nullptr),
                       braidInvalidArgument, "braidBroadcast", "root");
    EXPECT_BRAID_ERROR(braidReduce(a_, b_, 4, braidFloat32, braidSum, root, comm_, nullptr),
                       braidInvalidArgument, "braidReduce", "root");
    EXPECT_BRAID_ERROR(braidGather(a_, b_, 4, braidFloat32, root, comm_, nullptr),
                       braidInvalidArgument, "braidGather", "root");
    EXPECT_BRAID_ERROR(braidScatter(a_, b_, 4, braidFloat32, root, comm_, nullptr),
                       braidInvalidArgument, "braidScatter", "root");
  }
}

TEST_F(WithComm, NullBuffersWithCount) {
  const braidDataType_t f = braidFloat32;
  EXPECT_BRAID_ERROR(braidAllReduce(nullptr, b_, 4, f, braidSum, comm_, nullptr),
                     braidInvalidArgument, "braidAllReduce", "sendbuff");
  EXPECT_BRAID_ERROR(braidAllReduce(a_, nullptr, 4, f, braidSum, comm_, nullptr),
                     braidInvalidArgument, "braidAllReduce", "recvbuff");
  // The only rank is the root: its sendbuff matters.
  EXPECT_BRAID_ERROR(braidBroadcast(nullptr, b_, 4, f, 0, comm_, nullptr), braidInvalidArgument,
                     "braidBroadcast", "sendbuff");
  EXPECT_BRAID_ERROR(braidBroadcast(a_, nullptr, 4, f, 0, comm_, nullptr), braidInvalidArgument,
                     "braidBroadcast", "recvbuff");
  EXPECT_BRAID_ERROR(braidReduce(nullptr, b_, 4, f, braidSum, 0, comm_, nullptr),
                     braidInvalidArgument, "braidReduce", "sendbuff");
  EXPECT_BRAID_ERROR(braidReduce(a_, nullptr, 4, f, braidSum, 0, comm_, nullptr),
                     braidInvalidArgument, "braidReduce", "recvbuff");
  EXPECT_BRAID_ERROR(braidAllGather(nullptr, b_, 4, f, comm_, nullptr), braidInvalidArgument,
                     "braidAllGather", "sendbuff");
  EXPECT_BRAID_ERROR(braidAllGather(a_, nullptr, 4, f, comm_, nullptr), braidInvalidArgument,
                     "braidAllGather", "recvbuff");
  EXPECT_BRAID_ERROR(braidReduceScatter(nullptr, b_, 4, f, braidSum, comm_, nullptr),
                     braidInvalidArgument, "braidReduceScatter", "sendbuff");
  EXPECT_BRAID_ERROR(braidReduceScatter(a_, nullptr, 4, f, braidSum, comm_, nullptr),
                     braidInvalidArgument, "braidReduceScatter", "recvbuff");
  EXPECT_BRAID_ERROR(braidAllToAll(nullptr, b_, 4, f, comm_, nullptr), braidInvalidArgument,
                     "braidAllToAll", "sendbuff");
  EXPECT_BRAID_ERROR(braidAllToAll(a_, nullptr, 4, f, comm_, nullptr), braidInvalidArgument,
                     "braidAllToAll", "recvbuff");
  EXPECT_BRAID_ERROR(braidGather(nullptr, b_, 4, f, 0, comm_, nullptr), braidInvalidArgument,
                     "braidGather", "sendbuff");
  EXPECT_BRAID_ERROR(braidGather(a_, nullptr, 4, f, 0, comm_, nullptr), braidInvalidArgument,
                     "braidGather", "recvbuff");
  EXPECT_BRAID_ERROR(braidScatter(nullptr, b_, 4, f, 0, comm_, nullptr), braidInvalidArgument,
                     "braidScatter", "sendbuff");
  EXPECT_BRAID_ERROR(braidScatter(a_, nullptr, 4, f, 0, comm_, nullptr), braidInvalidArgument,
                     "braidScatter", "recvbuff");
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_ERROR(braidSend(nullptr, 4, f, 0, comm_, nullptr), braidInvalidArgument, "braidSend",
                     "sendbuff");
  EXPECT_BRAID_ERROR(braidRecv(nullptr, 4, f, 0, comm_, nullptr), braidInvalidArgument, "braidRecv",
                     "recvbuff");
  EXPECT_BRAID_ERROR(braidGroupEnd(), braidInvalidArgument, "braidGroupEnd", "none of them ran");
}

// A group one of whose calls was refused runs none of them, as NCCL's does:
// the rest alone would post half an exchange (here a Send whose Recv was
// refused), which its peer could never match, and braidGroupEnd would
// report success or a timeout instead of the error.
TEST_F(WithComm, AGroupWithARefusedCallRunsNoneOfItsCalls) {
  braidCommSetTimeout(comm_, 2);
  a_[0] = 7.0f;
  b_[0] = 0.0f;
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(braidSend(a_, 4, braidFloat32, 0, comm_, nullptr));
  EXPECT_BRAID_ERROR(braidRecv(nullptr, 4, braidFloat32, 0, comm_, nullptr), braidInvalidArgument,
                     "braidRecv", "recvbuff");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_BRAID_ERROR(braidGroupEnd(), braidInvalidArgument, "braidGroupEnd", "braidRecv: recvbuff");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // Nothing of it was posted: the next group pairs its own Send and Recv.
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(braidSend(a_, 4, braidFloat32, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidRecv(b_, 4, braidFloat32, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidGroupEnd());
  EXPECT_EQ(b_[0], 7.0f);
  // A refusal in a nested group drops the whole outer group.
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(braidSend(a_, 4, braidFloat32, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_ERROR(braidRecv(b_, 4, static_cast<braidDataType_t>(99), 0, comm_, nullptr),
                     braidInvalidArgument, "braidRecv", "datatype");
  EXPECT_BRAID_OK(braidGroupEnd());
  EXPECT_BRAID_ERROR(braidGroupEnd(), braidInvalidArgument, "braidGroupEnd", "datatype");
  EXPECT_BRAID_OK(braidAllReduce(a_, b_, 4, braidFloat32, braidSum, comm_, nullptr));
}

TEST_F(WithComm, ZeroCountWithNullBuffersSucceeds) {
  const braidDataType_t f = braidFloat32;
  EXPECT_BRAID_OK(braidAllReduce(nullptr, nullptr, 0, f, braidSum, comm_, nullptr));
  EXPECT_BRAID_OK(braidBroadcast(nullptr, nullptr, 0, f, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidReduce(nullptr, nullptr, 0, f, braidSum, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidAllGather(nullptr, nullptr, 0, f, comm_, nullptr));
  EXPECT_BRAID_OK(braidReduceScatter(nullptr, nullptr, 0, f, braidSum, comm_, nullptr));
  EXPECT_BRAID_OK(braidAllToAll(nullptr, nullptr, 0, f, comm_, nullptr));
  EXPECT_BRAID_OK(braidGather(nullptr, nullptr, 0, f, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidScatter(nullptr, nullptr, 0, f, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(braidSend(nullptr, 0, f, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidRecv(nullptr, 0, f, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidGroupEnd());
  EXPECT_BRAID_OK(braidBarrier(comm_, nullptr));
}

TEST_F(WithComm, AllToAllOverlappingBuffers) {
  EXPECT_BRAID_ERROR(braidAllToAll(a_, a_, 4, braidFloat32, comm_, nullptr), braidInvalidArgument,
                     "braidAllToAll", "overlap");
  EXPECT_BRAID_ERROR(braidAllToAll(a_, a_ + 2, 4, braidFloat32, comm_, nullptr),
                     braidInvalidArgument, "braidAllToAll", "overlap");
  EXPECT_BRAID_OK(braidAllToAll(a_, a_ + 4, 4, braidFloat32, comm_, nullptr));  // adjacent is fine
}

// A count whose bytes do not fit a size_t is refused, never wrapped to a
// smaller message.
TEST_F(WithComm, ACountWhoseBytesOverflowIsRefused) {
  const size_t huge = std::numeric_limits<size_t>::max() / 2;
  EXPECT_BRAID_ERROR(braidAllReduce(a_, b_, huge, braidFloat32, braidSum, comm_, nullptr),
                     braidInvalidArgument, "braidAllReduce", "too large");
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_ERROR(braidSend(a_, huge, braidFloat32, 0, comm_, nullptr), braidInvalidArgument,
                     "braidSend", "too large");
  EXPECT_BRAID_ERROR(braidRecv(b_, huge, braidFloat32, 0, comm_, nullptr), braidInvalidArgument,
                     "braidRecv", "too large");
  EXPECT_BRAID_ERROR(braidGroupEnd(), braidInvalidArgument, "braidGroupEnd", "none of them ran");
}

TEST_F(WithComm, PeerOutOfRangeAndSelfOutsideGroup) {
  for (int peer : {-1, 1}) {
    SCOPED_TRACE("peer " + std::to_string(peer));
    EXPECT_BRAID_ERROR(braidSend(a_, 4, braidFloat32, peer, comm_, nullptr), braidInvalidArgument,
                       "braidSend", "peer");
    EXPECT_BRAID_ERROR(braidRecv(b_, 4, braidFloat32, peer, comm_, nullptr), braidInvalidArgument,
                       "braidRecv", "peer");
  }
  EXPECT_BRAID_ERROR(braidSend(a_, 4, braidFloat32, 0, comm_, nullptr), braidInvalidArgument,
                     "braidSend", "peer");
  EXPECT_BRAID_ERROR(braidRecv(b_, 4, braidFloat32, 0, comm_, nullptr), braidInvalidArgument,
                     "braidRecv", "peer");
  // Inside a group the self exchange is fine.
  for (int i = 0; i < 4; ++i) a_[i] = static_cast<float>(i + 1);
  EXPECT_BRAID_OK(braidGroupStart());
  EXPECT_BRAID_OK(braidSend(a_, 4, braidFloat32, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidRecv(b_, 4, braidFloat32, 0, comm_, nullptr));
  EXPECT_BRAID_OK(braidGroupEnd());
  EXPECT_EQ(b_[3], 4.f);
}

TEST(Abort, LaterCallsFailAndDestroyWorks) {
  braidComm_t c = newComm();
  ASSERT_NE(c, nullptr);
  braidStream_t s = nullptr;
  braidComm_t sub = nullptr;
  float x[4] = {1, 2, 3, 4}, y[4] = {};
  EXPECT_BRAID_OK(braidCommAbort(c));
  EXPECT_BRAID_ERROR(braidAllReduce(x, y, 4, braidFloat32, braidSum, c, nullptr), braidInvalidUsage,
                     "braidAllReduce", "aborted");
  EXPECT_BRAID_ERROR(braidBroadcast(x, y, 4, braidFloat32, 0, c, nullptr), braidInvalidUsage,
                     "braidBroadcast", "aborted");
  EXPECT_BRAID_ERROR(braidBarrier(c, nullptr), braidInvalidUsage, "braidBarrier", "aborted");
  EXPECT_BRAID_ERROR(braidAllGather(x, y, 1, braidFloat32, c, nullptr), braidInvalidUsage,
                     "braidAllGather", "aborted");
  EXPECT_BRAID_ERROR(braidStreamCreate(c, &s), braidInvalidUsage, "braidStreamCreate", "aborted");
  EXPECT_BRAID_ERROR(braidCommSplit(c, 0, 0, &sub), braidInvalidUsage, "braidCommSplit", "aborted");
  // Only Destroy remains valid, the calls that ask about it or set it
  // included; the asynchronous error says it was aborted, for a watchdog
  // that polls it.
  int n = -1;
  const char* name = nullptr;
  void* handle = nullptr;
  EXPECT_BRAID_ERROR(braidCommCount(c, &n), braidInvalidUsage, "braidCommCount", "aborted");
  EXPECT_BRAID_ERROR(braidCommUserRank(c, &n), braidInvalidUsage, "braidCommUserRank", "aborted");
  EXPECT_BRAID_ERROR(braidCommSetTimeout(c, 5), braidInvalidUsage, "braidCommSetTimeout",
                     "aborted");
  EXPECT_BRAID_ERROR(braidCommGetTransport(c, 0, &name), braidInvalidUsage, "braidCommGetTransport",
                     "aborted");
  EXPECT_BRAID_ERROR(braidCommGetLastAlgorithm(c, "allreduce", &name), braidInvalidUsage,
                     "braidCommGetLastAlgorithm", "aborted");
  EXPECT_BRAID_ERROR(braidCommRegister(c, x, sizeof(x), &handle), braidInvalidUsage,
                     "braidCommRegister", "aborted");
  braidResult_t async = braidSuccess;
  EXPECT_BRAID_OK(braidCommGetAsyncError(c, &async));
  EXPECT_EQ(async, braidInvalidUsage);
  EXPECT_BRAID_OK(braidCommDestroy(c));
}

// The last channels belong to the link probe's two streams; a user's 125th
// stream still works, a 126th is refused by name.
TEST(Streams, AtMost125PerCommunicator) {
  braidComm_t c = newComm();
  ASSERT_NE(c, nullptr);
  std::vector<braidStream_t> streams(125, nullptr);
  for (braidStream_t& s : streams)
    ASSERT_EQ(braidStreamCreate(c, &s), braidSuccess) << braidGetLastError(nullptr);
  braidStream_t extra = nullptr;
  EXPECT_BRAID_ERROR(braidStreamCreate(c, &extra), braidInvalidUsage, "braidStreamCreate", "125",
                     "streams");
  EXPECT_EQ(extra, nullptr);
  float x[4] = {1, 2, 3, 4}, y[4] = {};
  EXPECT_BRAID_OK(braidAllReduce(x, y, 4, braidFloat32, braidSum, c, streams.back()));
  EXPECT_BRAID_OK(braidStreamSynchronize(streams.back()));
  EXPECT_EQ(y[3], 4.f);
  for (braidStream_t s : streams) EXPECT_BRAID_OK(braidStreamDestroy(s));
  EXPECT_BRAID_OK(braidCommDestroy(c));
}

TEST(Abort, QueuedStreamWorkFails) {
  braidComm_t c = newComm();
  ASSERT_NE(c, nullptr);
  braidStream_t s = nullptr;
  ASSERT_EQ(braidStreamCreate(c, &s), braidSuccess) << braidGetLastError(nullptr);
  std::vector<float> x(1 << 16, 1.f);
  EXPECT_BRAID_OK(braidCommAbort(c));
  braidResult_t r = braidAllReduce(x.data(), x.data(), x.size(), braidFloat32, braidSum, c, s);
  if (r == braidSuccess) r = braidStreamSynchronize(s);  // queued, then failed on the stream
  EXPECT_EQ(r, braidInvalidUsage) << braidGetLastError(nullptr);
  EXPECT_BRAID_OK(braidCommDestroy(c));    // waits for the stream's queue
  EXPECT_BRAID_OK(braidStreamDestroy(s));  // the handle outlives the communicator
}

}  // namespace
