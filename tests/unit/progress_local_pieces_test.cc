// The engine runs a large local step on the CPU in pieces and lets the
// connections have a turn between two pieces: a peer waiting on this rank
// (for room in a ring, an ack, a push) is not held up for a whole step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "src/progress.h"
#include "transports/loopback/loopback_connection.h"

namespace braid {
namespace {

using transport::Connection;
using transport::Request;
using transport::RequestPtr;
using transport::Tag;

// A peer whose one message arrives only once `watched` holds all of
// `expected`; each progress() notes how much of it was there.
class WatchingConnection final : public Connection {
 public:
  WatchingConnection(const uint8_t* watched, const uint8_t* expected, size_t bytes)
      : watched_(watched), expected_(expected), bytes_(bytes) {}

  RequestPtr postSend(const void*, size_t, Tag) override { return done(); }
  RequestPtr postRecv(void* data, size_t bytes, Tag) override {
    std::memset(data, 1, bytes);
    recv_ = std::make_shared<Request>();
    return recv_;
  }
  RequestPtr postRecvReduce(void*, const void*, size_t, Tag, const transport::Combiner&) override {
    return done();
  }
  Result<bool> progress() override {
    size_t there = 0;
    while (there < bytes_ && watched_[there] == expected_[there]) ++there;
    seen.push_back(there);
    if (there == bytes_ && recv_) recv_->complete();
    return there == bytes_;
  }
  int pollFd() const override { return -1; }
  bool wantsWrite() const override { return false; }
  void abort(const Status&) override {}
  int peer() const override { return 1; }
  Status peerFailure() const override { return Status::ok(); }
  bool ended() const override { return false; }
  std::optional<Tag> unclaimed(uint8_t, uint64_t) override { return stray; }
  bool mayHaveUnclaimed() const override { return stray.has_value(); }

  std::vector<size_t> seen;  // bytes of the local step's output done, per progress()
  std::optional<Tag> stray;  // a message of the peer's that no receive took

 private:
  static RequestPtr done() {
    auto r = std::make_shared<Request>();
    r->complete();
    return r;
  }
  const uint8_t* watched_;
  const uint8_t* expected_;
  size_t bytes_;
  RequestPtr recv_;
};

struct LocalStepRun {
  std::vector<uint8_t> send, recv, expected;
  std::vector<size_t> seen;
  Status status;
};

// Rank 0's job of two ranks, bytes summed as uint8, 5 s to run.
Job rankZeroOfTwo(const algo::Schedule& schedule, uint8_t* send, uint8_t* recv,
                  const std::vector<Connection*>& connections, const char* callName) {
  Job job;
  job.schedule = &schedule;
  job.send = send;
  job.recv = recv;
  job.nranks = 2;
  job.rank = 0;
  job.dtype = DataType::kUint8;
  job.op = RedOp::kSum;
  job.connections = connections;
  job.tagFor = [](bool, int, uint32_t k) { return Tag{k, 1}; };
  job.callName = callName;
  job.timeoutSeconds = 5;
  return job;
}

// Rank 0 of 2 receives 64 bytes from rank 1 and, independently, copies or
// reduces `bytes` locally.
LocalStepRun runLocalStep(algo::StepKind kind, size_t bytes) {
  LocalStepRun run;
  run.send.resize(2 * bytes);
  for (size_t i = 0; i < run.send.size(); ++i) run.send[i] = static_cast<uint8_t>(i % 251 + 1);
  run.recv.assign(bytes + 64, 0);
  run.expected.resize(bytes);
  algo::Schedule schedule;
  schedule.recv(1, {algo::BufferId::kRecv, bytes, 64});
  if (kind == algo::StepKind::kCopy) {
    schedule.copy({algo::BufferId::kRecv, 0, bytes}, {algo::BufferId::kSend, 0, bytes});
    std::copy(run.send.begin(), run.send.begin() + bytes, run.expected.begin());
  } else {
    schedule.reduce({algo::BufferId::kRecv, 0, bytes}, {algo::BufferId::kSend, 0, bytes},
                    {algo::BufferId::kSend, bytes, bytes});
    for (size_t i = 0; i < bytes; ++i)
      run.expected[i] = static_cast<uint8_t>(run.send[i] + run.send[bytes + i]);
  }
  transport::LoopbackConnection self(0);
  WatchingConnection peer(run.recv.data(), run.expected.data(), bytes);
  std::vector<Connection*> connections = {&self, &peer};
  Job job = rankZeroOfTwo(schedule, run.send.data(), run.recv.data(), connections, "local step");
  run.status = runJobs({&job, 1});
  run.seen = peer.seen;
  return run;
}

TEST(LocalSteps, ALargeCopyLetsTheConnectionsInBetweenItsPieces) {
  const size_t bytes = 8 << 20;
  LocalStepRun run = runLocalStep(algo::StepKind::kCopy, bytes);
  ASSERT_TRUE(run.status.isOk()) << run.status.message();
  EXPECT_TRUE(std::equal(run.expected.begin(), run.expected.end(), run.recv.begin()));
  const auto partial = std::count_if(run.seen.begin(), run.seen.end(),
                                     [&](size_t there) { return there > 0 && there < bytes; });
  EXPECT_GE(partial, 8) << "the peer's connection progressed while the copy ran, piece by piece";
}

TEST(LocalSteps, ALargeReductionRunsInPiecesToTheSameResult) {
  const size_t bytes = (4 << 20) + 3;  // no multiple of a piece
  LocalStepRun run = runLocalStep(algo::StepKind::kReduce, bytes);
  ASSERT_TRUE(run.status.isOk()) << run.status.message();
  EXPECT_TRUE(std::equal(run.expected.begin(), run.expected.end(), run.recv.begin()));
  const auto partial = std::count_if(run.seen.begin(), run.seen.end(),
                                     [&](size_t there) { return there > 0 && there < bytes; });
  EXPECT_GE(partial, 4);
}

// A call whose steps are all local (or whose last one is) ends inside
// the engine's first pass; a message the peer sent it that no receive took
// still shows the two ranks made different calls.
TEST(LocalSteps, ACallThatEndsOnALocalStepStillFindsAStrayMessage) {
  std::vector<uint8_t> send(64, 3), recv(64, 0);
  algo::Schedule schedule;
  schedule.copy({algo::BufferId::kRecv, 0, 64}, {algo::BufferId::kSend, 0, 64});
  transport::LoopbackConnection self(0);
  WatchingConnection peer(recv.data(), recv.data(), 0);
  peer.stray = Tag{5, 0x77};
  std::vector<Connection*> connections = {&self, &peer};
  Job job = rankZeroOfTwo(schedule, send.data(), recv.data(), connections, "local call");
  job.tagsBelow = 1 << 20;
  const Status s = runJobs({&job, 1});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidUsage) << s.message();
  EXPECT_NE(s.message().find("mismatched calls"), std::string::npos) << s.message();
}

TEST(LocalSteps, ASmallCopyRunsWhole) {
  const size_t bytes = 256 << 10;
  LocalStepRun run = runLocalStep(algo::StepKind::kCopy, bytes);
  ASSERT_TRUE(run.status.isOk()) << run.status.message();
  EXPECT_TRUE(std::equal(run.expected.begin(), run.expected.end(), run.recv.begin()));
  EXPECT_TRUE(std::none_of(run.seen.begin(), run.seen.end(),
                           [&](size_t there) { return there > 0 && there < bytes; }));
}

}  // namespace
}  // namespace braid
