// Splitting large messages into pieces (algorithms/split.h): every
// algorithm's split schedules compute, in the simulator, exactly what the
// whole ones do, stay well formed and free of races, and send no message
// larger than a piece.
#include "algorithms/split.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/fuse.h"
#include "src/common/strcat.h"
#include "tests/harness/sim_network.h"

namespace braid::algo {
namespace {

// P ranks' memory for `args`, with inputs that differ on every rank.
std::vector<sim::RankMemory> inputs(const CollectiveArgs& base,
                                    const std::vector<Schedule>& plans) {
  std::vector<sim::RankMemory> memory(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) {
    CollectiveArgs args = base;
    args.rank = static_cast<int>(r);
    memory[r].send.resize(sendBufferBytes(args));
    for (size_t i = 0; i + 4 <= memory[r].send.size(); i += 4) {
      const int32_t v = static_cast<int32_t>(i * 7 + r * 1000003);
      std::memcpy(memory[r].send.data() + i, &v, 4);
    }
    memory[r].recv.assign(recvBufferBytes(args), 0xee);
    memory[r].scratch.resize(plans[r].scratchBytes);
  }
  return memory;
}

TEST(SplitTransfers, EveryAlgorithmComputesWhatItsWholeMessagesDo) {
  constexpr size_t kPiece = 100;  // bytes: 25 int32 elements
  size_t splitSchedules = 0;
  for (const Algorithm& a : allAlgorithms()) {
    if (a.kind == CollectiveKind::kSendRecv) continue;
    for (int P : {2, 3, 5}) {
      SCOPED_TRACE(strCat(collectiveName(a.kind), "/", a.name, " P=", P));
      CollectiveArgs args;
      args.kind = a.kind;
      args.count = a.kind == CollectiveKind::kAllToAll ? 301 : 1001;
      args.dtype = DataType::kInt32;
      args.op = RedOp::kSum;
      args.root = P - 1;
      args.nranks = P;
      args.chunkBytes = 4096;
      std::vector<Schedule> whole, split;
      for (int r = 0; r < P; ++r) {
        args.rank = r;
        whole.push_back(a.plan(args));
        fuseReceiveReductions(whole.back());
        split.push_back(splitTransfers(whole.back(), kPiece, 4));
        splitSchedules += split.back().steps.size() > whole.back().steps.size();
        EXPECT_EQ(validate(split.back(), sendBufferBytes(args), recvBufferBytes(args), 4), "");
        for (const Step& s : split.back().steps) {
          if (s.kind == StepKind::kSend) {
            EXPECT_LE(s.src.bytes, kPiece);
          }
        }
      }
      args.rank = 0;
      auto expected = inputs(args, whole), got = inputs(args, split);
      ASSERT_EQ(sim::run(whole, expected, DataType::kInt32, RedOp::kSum), "");
      ASSERT_EQ(sim::run(split, got, DataType::kInt32, RedOp::kSum), "");
      for (int r = 0; r < P; ++r) {
        EXPECT_EQ(got[r].recv, expected[r].recv) << "rank " << r;
        EXPECT_EQ(sim::findRaces(split[r], got[r]), "") << "rank " << r;
      }
    }
  }
  EXPECT_GT(splitSchedules, 30u);  // the test split something
}

// Pieces end on whole elements, and a schedule with nothing larger than a
// piece comes back as it was.
TEST(SplitTransfers, PiecesAreWholeElementsAndSmallMessagesStay) {
  Schedule s;
  const StepIndex recv = s.recv(1, {BufferId::kRecv, 0, 40});
  s.copy({BufferId::kRecv, 40, 8}, {BufferId::kRecv, 0, 8}, recv);
  const Schedule split = splitTransfers(s, 12, 8);  // pieces of 8 bytes
  size_t received = 0;
  for (const Step& step : split.steps)
    if (step.kind == StepKind::kRecv) {
      EXPECT_EQ(step.dst.bytes, 8u);
      EXPECT_EQ(step.dst.offset, received);
      received += step.dst.bytes;
    }
  EXPECT_EQ(received, 40u);
  // The copy waits for the join of all five pieces, which comes before it.
  const Step& last = split.steps.back();
  EXPECT_EQ(last.kind, StepKind::kCopy);
  EXPECT_EQ(last.dst.offset, 40u);
  EXPECT_EQ(splitTransfers(s, 40, 8).steps.size(), s.steps.size());
}

}  // namespace
}  // namespace braid::algo
