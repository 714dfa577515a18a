// The first GPU call of a communicator on a CUDA stream maps the memory of
// the peers of its host on the calling thread, before the stream waits:
// mapping takes the driver's memory lock, which an application thread may
// hold until the stream gets past the call. A peer that reaches its first
// GPU call late is waited for, up to BRAID_CUDA_IPC_CONNECT_SECONDS (30),
// unless the shared-memory board shows it waiting for this rank (in a
// collective this rank has not made, in a Send or Recv with it, or for a
// peer that waits so), so that this rank can go on to its own call (the
// other late peers still waited for); and a first GPU call on another
// thread meanwhile waits for that wait to end.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "braid.h"
#include "gpu_ranks.h"

namespace {

using namespace braid::testing::gpu_ranks;

class LatePeer : public ForkedGpuRanks {
 protected:
  // Every rank of `nranks` passes `body`, under BRAID_TIMEOUT=`timeoutSeconds`.
  static void expectRanksPass(int nranks, RankBody body, int timeoutSeconds) {
    RankSetup setup;
    setup.environment = {"BRAID_TIMEOUT=" + std::to_string(timeoutSeconds)};
    expectEveryRankPassed(runRanks(nranks, body, setup));
  }
};

// Queues an AllGather of `count` floats from each rank on the CUDA stream.
int allGatherOnTheStream(Rank& r, OnACudaStream& on, int step, size_t count = kCount) {
  for (size_t i = 0; i < count; ++i) on.send[i] = value(r.rank(), 0, i);
  RANK_CHECK(step, braidAllGather(on.send, on.recv, count, braidFloat32, r.comm, on.stream) ==
                       braidSuccess);
  return 0;
}

// Once the stream got past it: its result.
int checkTheAllGather(Rank& r, OnACudaStream& on, int step, size_t count = kCount) {
  RANK_CHECK(step, braidStreamSynchronize(on.stream) == braidSuccess);
  RANK_CHECK(step + 1, firstWrong(on.recv, r.nranks() * count, [&](size_t i) {
                         return value(static_cast<int>(i / count), 0, i % count);
                       }) == -1);
  return 0;
}

// Once the stream got past it: its result, and the streams let go.
int endTheAllGather(Rank& r, OnACudaStream& on, int step) {
  if (const int failed = checkTheAllGather(r, on, step)) return failed;
  RANK_CHECK(step + 2, fake.streamSynchronize(on.cudaStream) == 0);
  RANK_CHECK(step + 3, braidStreamDestroy(on.stream) == braidSuccess);
  return 0;
}

// A host AllReduce on stream NULL of one float, 1 from each rank.
int allReduceOnTheHost(Rank& r, float* sum, int step) {
  const float one = 1;
  RANK_CHECK(step,
             braidAllReduce(&one, sum, 1, braidFloat32, braidSum, r.comm, nullptr) == braidSuccess);
  return 0;
}

// Rank 1 makes the AllGather `seconds` after rank 0, while the stand-in
// holds the memory lock: no mapping may be refused. Steps `step` to `step+5`.
int allGatherWithRankOneLate(Rank& r, OnACudaStream& on, int seconds, int step) {
  on.holdTheMemoryLock();
  if (r.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(seconds));
  if (const int failed = allGatherOnTheStream(r, on, step)) return failed;
  if (const int failed = checkTheAllGather(r, on, step + 1)) return failed;
  return on.releaseTheMemoryLock(r, step + 3);
}

// Rank 1 reaches its first GPU call 6 s after rank 0, later than the wait
// of 5 s braid had before.
int aLatePeerIsMappedBeforeTheStreamWaits(Rank& r) {
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  return allGatherWithRankOneLate(r, on, 6, 13);
}

TEST_F(LatePeer, IsMappedBeforeTheStreamWaits) {
  expectRanksPass(2, aLatePeerIsMappedBeforeTheStreamWaits, 30);
}

// Rank 0 makes its first GPU calls from two threads at once, on two CUDA
// streams, while rank 1 is 3 s late: the second thread's call waits for the
// first's wait to end, rather than have rank 1's memory mapped while its
// stream waits. The blocks are small: both calls' messages fit in the
// slots, whatever order rank 1 receives them in, so nothing spills.
int twoThreadsMakeTheirFirstCallsAtOnce(Rank& r) {
  constexpr size_t kSmall = 2 * kChunkBytes / sizeof(float);
  OnACudaStream first, second;
  if (const int failed = first.setUp(r)) return failed;
  if (const int failed = second.setUp(r)) return failed;
  first.holdTheMemoryLock();  // the stand-in's, for the whole process
  if (r.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(3));
  int secondFailed = 0;
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    secondFailed = allGatherOnTheStream(r, second, 30, kSmall);
  });
  const int firstFailed = allGatherOnTheStream(r, first, 13, kSmall);
  other.join();
  if (firstFailed != 0) return firstFailed;
  if (secondFailed != 0) return secondFailed;
  if (const int failed = checkTheAllGather(r, first, 14, kSmall)) return failed;
  if (const int failed = checkTheAllGather(r, second, 31, kSmall)) return failed;
  RANK_CHECK(33, fake.streamSynchronize(second.cudaStream) == 0);
  RANK_CHECK(34, braidStreamDestroy(second.stream) == braidSuccess);
  return first.releaseTheMemoryLock(r, 16);
}

TEST_F(LatePeer, AFirstCallOnAnotherThreadWaitsForTheWaitToEnd) {
  expectRanksPass(2, twoThreadsMakeTheirFirstCallsAtOnce, 30);
}

// Rank 1 first makes a host AllReduce on stream NULL, which rank 0 makes
// only after its first GPU call (which returns at once, the stream waiting
// for it): rank 0 stops waiting for rank 1's handshake when the board shows
// rank 1 in that call, rather than wait the full 30 s, by when rank 1's
// AllReduce would have failed (BRAID_TIMEOUT=20).
int aPeerInAnotherCallIsNotWaitedFor(Rank& r) {
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  float sum = 0;
  // Rank 1's AllReduce starts first.
  if (r.rank() == 0) std::this_thread::sleep_for(std::chrono::seconds(2));
  if (const int failed = r.rank() == 1 ? allReduceOnTheHost(r, &sum, 13) : 0) return failed;
  if (const int failed = allGatherOnTheStream(r, on, 14)) return failed;
  if (const int failed = r.rank() == 0 ? allReduceOnTheHost(r, &sum, 17) : 0) return failed;
  RANK_CHECK(18, sum == 2.0f);
  return endTheAllGather(r, on, 19);
}

TEST_F(LatePeer, OneThatWaitsInAnotherCallIsNotWaitedFor) {
  expectRanksPass(2, aPeerInAnotherCallIsNotWaitedFor, 20);
}

// Of three ranks, rank 2 first makes a host AllReduce on stream NULL, which
// rank 0 makes only after its first GPU call, while rank 1 reaches its first
// GPU call 3 s late and its AllReduce 2 s after that. Rank 0 stops waiting
// for rank 2 but still waits for rank 1 and maps its memory before the
// stream waits: mapped during the call, while the stand-in holds the memory
// lock through the AllReduce, it would be refused. Rank 2 makes its GPU
// call after a Barrier that rank 0 joins once the lock is free again.
int onlyThePeerInAnotherCallIsNotWaitedFor(Rank& r) {
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  float sum = 0;
  if (r.rank() == 0) on.holdTheMemoryLock();
  if (r.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(3));
  if (r.rank() == 2) {
    if (const int failed = allReduceOnTheHost(r, &sum, 13)) return failed;
    RANK_CHECK(14, braidBarrier(r.comm, nullptr) == braidSuccess);
  }
  if (const int failed = allGatherOnTheStream(r, on, 15)) return failed;
  if (r.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(2));
  if (r.rank() != 2) {
    if (const int failed = allReduceOnTheHost(r, &sum, 16)) return failed;
    if (r.rank() == 0) fake.holdMemoryLock(0);
    RANK_CHECK(17, braidBarrier(r.comm, nullptr) == braidSuccess);
  }
  RANK_CHECK(18, sum == 3.0f);
  if (const int failed = endTheAllGather(r, on, 19)) return failed;
  RANK_CHECK(23, fake.memoryLockRefusals() == on.refusedBefore);
  return 0;
}

TEST_F(LatePeer, OnlyThePeerInAnotherCallIsNotWaitedFor) {
  expectRanksPass(3, onlyThePeerInAnotherCallIsNotWaitedFor, 20);
}

// Of three ranks, rank 2 first makes a host AllReduce that rank 0 makes on
// another thread only 1 s after its first GPU call; rank 1 joins it after
// 2 s, and rank 2 makes its GPU call 1 s after it ends. Rank 0 looks past
// rank 2 only while it waits in the AllReduce, then waits for it again, and
// maps both peers' memory before the stream waits, while the stand-in holds
// the memory lock.
int aPeerNoLongerInAnotherCallIsWaitedForAgain(Rank& r) {
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  float sum = 0;
  int allReduceFailed = 0;
  struct JoinedOnReturn {
    std::thread thread;
    ~JoinedOnReturn() {
      if (thread.joinable()) thread.join();
    }
  } other;
  on.holdTheMemoryLock();
  if (r.rank() == 0)
    other.thread = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      allReduceFailed = allReduceOnTheHost(r, &sum, 13);
    });
  if (r.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(2));
  if (r.rank() != 0) {
    if (const int failed = allReduceOnTheHost(r, &sum, 13)) return failed;
    if (r.rank() == 2) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (const int failed = allGatherOnTheStream(r, on, 14)) return failed;
  if (other.thread.joinable()) other.thread.join();
  if (allReduceFailed != 0) return allReduceFailed;
  RANK_CHECK(15, sum == 3.0f);
  if (const int failed = checkTheAllGather(r, on, 16)) return failed;
  return on.releaseTheMemoryLock(r, 18);
}

TEST_F(LatePeer, OneNoLongerInAnotherCallIsWaitedForAgain) {
  expectRanksPass(3, aPeerNoLongerInAnotherCallIsWaitedForAgain, 20);
}

// Of three ranks, rank 1 first makes a blocking host Recv from rank 0, which
// rank 0 sends only after its first GPU call, and rank 2 a blocking host
// Recv from rank 1, which rank 1 sends after its Recv: rank 0 stops waiting
// for both, rank 2 waiting for rank 1, which waits for rank 0, rather than
// wait the full 30 s for rank 2, by when rank 1's Recv would have failed
// (BRAID_TIMEOUT=20).
int aPeerWaitingForAPeerThatWaitsIsNotWaitedFor(Rank& r) {
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  float message = 0;
  if (r.rank() == 0) std::this_thread::sleep_for(std::chrono::seconds(1));
  if (r.rank() >= 1)
    RANK_CHECK(13,
               braidRecv(&message, 1, braidFloat32, r.rank() - 1, r.comm, nullptr) == braidSuccess);
  if (r.rank() == 1)
    RANK_CHECK(14, braidSend(&message, 1, braidFloat32, 2, r.comm, nullptr) == braidSuccess);
  if (const int failed = allGatherOnTheStream(r, on, 15)) return failed;
  if (r.rank() == 0) {
    message = 9;
    RANK_CHECK(16, braidSend(&message, 1, braidFloat32, 1, r.comm, nullptr) == braidSuccess);
  }
  RANK_CHECK(17, message == 9.0f);
  return endTheAllGather(r, on, 18);
}

TEST_F(LatePeer, OneWaitingForAPeerThatWaitsIsNotWaitedFor) {
  expectRanksPass(3, aPeerWaitingForAPeerThatWaitsIsNotWaitedFor, 20);
}

// Rank 1 has a Recv from rank 0 queued on a braid stream, and rank 0 one
// from rank 1 on another, when rank 0 makes its first GPU call, 3 s before
// rank 1 makes its own; then each sends. Rank 1's Recv does not show it
// waiting for rank 0, which has a Recv from it under way too, so rank 0
// still waits for rank 1 and maps its memory before the stream waits, while
// the stand-in holds the memory lock.
int aPeerWithAMatchUnderWayIsWaitedFor(Rank& r) {
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  braidStream_t streams[2] = {nullptr, nullptr};
  for (braidStream_t& stream : streams)
    RANK_CHECK(13, braidStreamCreate(r.comm, &stream) == braidSuccess);
  float mine = static_cast<float>(r.rank() + 1), theirs = 0;
  const int peer = 1 - r.rank();
  // Rank 0 receives on the first stream, rank 1 on the second.
  RANK_CHECK(14,
             braidRecv(&theirs, 1, braidFloat32, peer, r.comm, streams[r.rank()]) == braidSuccess);
  if (const int failed = allGatherWithRankOneLate(r, on, 3, 15)) return failed;
  RANK_CHECK(21, braidSend(&mine, 1, braidFloat32, peer, r.comm, streams[peer]) == braidSuccess);
  for (braidStream_t stream : streams) {
    RANK_CHECK(22, braidStreamSynchronize(stream) == braidSuccess);
    RANK_CHECK(23, braidStreamDestroy(stream) == braidSuccess);
  }
  RANK_CHECK(24, theirs == static_cast<float>(peer + 1));
  return 0;
}

TEST_F(LatePeer, OneWithAMatchUnderWayIsWaitedFor) {
  expectRanksPass(2, aPeerWithAMatchUnderWayIsWaitedFor, 30);
}

// Rank 1 first makes a host Recv from rank 0 (on stream NULL, or on a braid
// stream and waits for it), which rank 0 sends (on the same stream) only
// after its first GPU call: rank 0 stops waiting for rank 1's handshake once the board shows
// rank 1 in a Recv from it, rather than wait the full 30 s, by when rank 1's
// Recv would have failed (BRAID_TIMEOUT=20).
int aPeerInARecvFromThisRankIsNotWaitedFor(Rank& r, bool onABraidStream) {
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  float message = 0;
  braidStream_t hostStream = nullptr;
  if (onABraidStream) RANK_CHECK(11, braidStreamCreate(r.comm, &hostStream) == braidSuccess);
  if (r.rank() == 0) std::this_thread::sleep_for(std::chrono::seconds(2));
  if (r.rank() == 1) {
    RANK_CHECK(12, braidRecv(&message, 1, braidFloat32, 0, r.comm, hostStream) == braidSuccess);
    if (onABraidStream) RANK_CHECK(13, braidStreamSynchronize(hostStream) == braidSuccess);
  }
  if (const int failed = allGatherOnTheStream(r, on, 14)) return failed;
  if (r.rank() == 0) {
    message = 7;
    RANK_CHECK(16, braidSend(&message, 1, braidFloat32, 1, r.comm, hostStream) == braidSuccess);
    if (onABraidStream) RANK_CHECK(17, braidStreamSynchronize(hostStream) == braidSuccess);
  }
  RANK_CHECK(18, message == 7.0f);
  if (onABraidStream) RANK_CHECK(19, braidStreamDestroy(hostStream) == braidSuccess);
  return endTheAllGather(r, on, 20);
}

TEST_F(LatePeer, OneInARecvFromThisRankIsNotWaitedFor) {
  expectRanksPass(
      2, [](Rank& r) { return aPeerInARecvFromThisRankIsNotWaitedFor(r, false); }, 20);
  expectRanksPass(
      2, [](Rank& r) { return aPeerInARecvFromThisRankIsNotWaitedFor(r, true); }, 20);
}

// Rank 1 receives from rank 0 on the host twice (on stream NULL, then on a
// braid stream), then reaches its first GPU call 3 s after rank 0, while
// the stand-in holds the memory lock: its ended Recvs no longer count on
// the board, so rank 0 still waits for it and maps its memory before the
// stream waits.
int aPeerWhoseRecvsEndedIsWaitedFor(Rank& r) {
  OnACudaStream on;
  if (const int failed = on.setUp(r)) return failed;
  braidStream_t hostStream = nullptr;
  RANK_CHECK(13, braidStreamCreate(r.comm, &hostStream) == braidSuccess);
  for (braidStream_t stream : {braidStream_t{nullptr}, hostStream}) {
    float message = 5;
    if (r.rank() == 0)
      RANK_CHECK(14, braidSend(&message, 1, braidFloat32, 1, r.comm, stream) == braidSuccess);
    else
      RANK_CHECK(15, braidRecv(&message, 1, braidFloat32, 0, r.comm, stream) == braidSuccess);
    if (stream != nullptr) RANK_CHECK(16, braidStreamSynchronize(stream) == braidSuccess);
    RANK_CHECK(17, message == 5.0f);
  }
  RANK_CHECK(18, braidStreamDestroy(hostStream) == braidSuccess);
  return allGatherWithRankOneLate(r, on, 3, 19);
}

TEST_F(LatePeer, OneWhoseRecvsEndedIsWaitedFor) {
  expectRanksPass(2, aPeerWhoseRecvsEndedIsWaitedFor, 30);
}

}  // namespace
