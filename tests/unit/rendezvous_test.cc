// Every algorithm's schedules complete when a send is done only once its
// receive has started (sim::Delivery::kRendezvous): the condition under
// which cuda_ipc may let a peer read a message in place, out of the
// sender's buffer, rather than copy it through slots first. A schedule
// that waited for a send before posting the receive its peer's send needs
// would deadlock there, so this is checked for every collective, world
// size, in place or not, whole and cut into pieces.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/fuse.h"
#include "algorithms/split.h"
#include "src/common/strcat.h"
#include "tests/harness/sim_network.h"

namespace braid::algo {
namespace {

std::vector<sim::RankMemory> memoryFor(const CollectiveArgs& base,
                                       const std::vector<Schedule>& plans) {
  std::vector<sim::RankMemory> memory(plans.size());
  for (size_t r = 0; r < plans.size(); ++r) {
    CollectiveArgs args = base;
    args.rank = static_cast<int>(r);
    memory[r].send.assign(sendBufferBytes(args), 1);
    memory[r].recv.assign(recvBufferBytes(args), 0);
  }
  return memory;
}

// Every rank's schedule of `a` for `args` (fused as the engine fuses it, cut
// into pieces of `piece` bytes where that is above 0), run by the simulator
// with sends that end only at their receive; what it found, or "".
std::string runWithRendezvous(const Algorithm& a, CollectiveArgs args, size_t piece) {
  std::vector<Schedule> plans;
  for (int r = 0; r < args.nranks; ++r) {
    args.rank = r;
    plans.push_back(a.plan(args));
    fuseReceiveReductions(plans.back());
    if (piece > 0) plans.back() = splitTransfers(plans.back(), piece, 4);
  }
  auto memory = memoryFor(args, plans);
  for (int r = 0; r < args.nranks; ++r) memory[r].scratch.resize(plans[r].scratchBytes);
  return sim::run(plans, memory, args.dtype, args.op, sim::Delivery::kRendezvous);
}

// A schedule with the pattern rendezvous cannot run: each of two ranks
// sends, and receives only once its send is done. The simulator must say
// so, or the test below proves nothing.
TEST(Rendezvous, TheSimulatorFindsASendThatWaitsForItsOwnReceive) {
  std::vector<Schedule> plans(2);
  for (int r = 0; r < 2; ++r) {
    const StepIndex sent = plans[r].send(1 - r, {BufferId::kSend, 0, 8});
    plans[r].recv(1 - r, {BufferId::kRecv, 0, 8}, sent);
  }
  std::vector<sim::RankMemory> memory(2);
  for (auto& m : memory) m.send.assign(8, 1), m.recv.assign(8, 0);
  EXPECT_EQ(sim::run(plans, memory, DataType::kInt32, RedOp::kSum), "");
  EXPECT_NE(sim::run(plans, memory, DataType::kInt32, RedOp::kSum, sim::Delivery::kRendezvous)
                .find("deadlock"),
            std::string::npos);
}

TEST(Rendezvous, EveryAlgorithmCompletesWhenSendsWaitForTheirReceives) {
  size_t runs = 0;
  for (const Algorithm& a : allAlgorithms()) {
    if (a.kind == CollectiveKind::kSendRecv) continue;
    for (int P : {2, 3, 4, 5, 7, 8, 9, 16}) {
      for (bool inPlace : {false, true}) {
        for (size_t piece : {size_t{0}, size_t{96}}) {
          SCOPED_TRACE(strCat(collectiveName(a.kind), "/", a.name, " P=", P,
                              inPlace ? " in place" : "", " piece=", piece));
          CollectiveArgs args;
          args.kind = a.kind;
          args.count = 1000;
          args.dtype = DataType::kInt32;
          args.root = P / 2;
          args.nranks = P;
          args.inPlace = inPlace;
          args.chunkBytes = 1024;
          ASSERT_EQ(runWithRendezvous(a, args, piece), "");
          ++runs;
        }
      }
    }
  }
  EXPECT_GT(runs, 300u);
}

// The same where the dependency graph changes shape: counts below the rank
// count (empty blocks, halving's empty ranges) and roots at either end.
TEST(Rendezvous, SmallCountsAndEdgeRootsCompleteToo) {
  size_t runs = 0;
  for (const Algorithm& a : allAlgorithms()) {
    if (a.kind == CollectiveKind::kSendRecv) continue;
    for (int P : {5, 6, 7}) {
      for (size_t count : {size_t{1}, static_cast<size_t>(P - 1)}) {
        for (int root : {0, P - 1}) {
          for (bool inPlace : {false, true}) {
            SCOPED_TRACE(strCat(collectiveName(a.kind), "/", a.name, " P=", P, " count=", count,
                                " root=", root, inPlace ? " in place" : ""));
            CollectiveArgs args;
            args.kind = a.kind;
            args.count = count;
            args.dtype = DataType::kInt32;
            args.root = root;
            args.nranks = P;
            args.inPlace = inPlace;
            args.chunkBytes = 8;
            ASSERT_EQ(runWithRendezvous(a, args, 0), "");
            ++runs;
          }
        }
      }
    }
  }
  EXPECT_GT(runs, 300u);
}

}  // namespace
}  // namespace braid::algo
