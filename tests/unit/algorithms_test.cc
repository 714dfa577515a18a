// Every registered algorithm, run for many world sizes on the simulated
// network, against a serial reference; plus the schedule invariants.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "algorithms/algorithm.h"
#include "algorithms/dbtree.h"
#include "algorithms/fuse.h"
#include "src/common/reduce.h"
#include "src/common/strcat.h"
#include "tests/harness/sim_network.h"

namespace braid {
namespace {

using algo::CollectiveArgs;
using algo::CollectiveKind;

// Inputs are small integers (products use +-1), so every partial result
// is exact in every type tested and any association order gives the
// serial reference bit for bit.
double inputValue(RedOp op, int rank, size_t i) {
  if (op == RedOp::kProd) return (rank + i) % 3 == 0 ? -1 : 1;
  return static_cast<double>((rank * 7 + i * 3) % 5) - 1;
}

void store(DataType t, uint8_t* p, double v) {
  switch (t) {
    case DataType::kInt8: {
      int8_t x = static_cast<int8_t>(v);
      std::memcpy(p, &x, 1);
      break;
    }
    case DataType::kInt64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case DataType::kInt32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DataType::kFloat16: {
      uint16_t x = floatToHalf(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    case DataType::kBfloat16: {
      uint16_t x = floatToBfloat16(static_cast<float>(v));
      std::memcpy(p, &x, 2);
      break;
    }
    default:
      std::memcpy(p, &v, 8);
  }
}

double load(DataType t, const uint8_t* p) {
  switch (t) {
    case DataType::kInt8: {
      int8_t x;
      std::memcpy(&x, p, 1);
      return x;
    }
    case DataType::kInt64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case DataType::kInt32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DataType::kFloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return halfToFloat(x);
    }
    case DataType::kBfloat16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      return bfloat16ToFloat(x);
    }
    default: {
      double x;
      std::memcpy(&x, p, 8);
      return x;
    }
  }
}

double combine(RedOp op, double a, double b) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      return a + b;
    case RedOp::kProd:
      return a * b;
    case RedOp::kMax:
      return std::max(a, b);
    case RedOp::kMin:
      return std::min(a, b);
  }
  return 0;
}

double reduceOverRanks(DataType t, RedOp op, int P, size_t i) {
  double acc = inputValue(op, 0, i);
  for (int r = 1; r < P; ++r) acc = combine(op, acc, inputValue(op, r, i));
  const bool integer = t == DataType::kInt8 || t == DataType::kInt32 || t == DataType::kInt64;
  if (op == RedOp::kAvg) acc = integer ? std::trunc(acc / P) : acc / P;
  return acc;
}

struct Case {
  CollectiveKind kind;
  int P;
  size_t count;
  DataType dtype;
  RedOp op;
  int root;
  bool inPlace;
  size_t chunkBytes;
  // Run what the engine runs: Recv+Reduce pairs fused (algorithms/fuse.h).
  bool fuse = true;
};

std::string describe(const algo::Algorithm& a, const Case& c) {
  return strCat(algo::collectiveName(c.kind), "/", a.name, " P=", c.P, " count=", c.count, " ",
                dataTypeName(c.dtype), " op=", redOpName(c.op), " root=", c.root,
                c.inPlace ? " in-place" : "", " chunk=", c.chunkBytes, c.fuse ? "" : " unfused");
}

bool reduces(CollectiveKind k) {
  return k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduce ||
         k == CollectiveKind::kReduceScatter;
}

void runCase(const algo::Algorithm& algorithm, const Case& c) {
  const size_t es = dataTypeSize(c.dtype);
  const int P = c.P;
  const size_t n = c.count;
  std::vector<algo::Schedule> plans;
  std::vector<sim::RankMemory> memory(P);
  auto fill = [&](std::vector<uint8_t>& bytes, size_t elements, int rank) {
    bytes.assign(elements * es, 0);
    for (size_t i = 0; i < elements; ++i)
      store(c.dtype, bytes.data() + i * es, inputValue(c.op, rank, i));
  };
  for (int r = 0; r < P; ++r) {
    CollectiveArgs args{c.kind, n, c.dtype, c.op, c.root, r, P, c.inPlace, c.chunkBytes};
    plans.push_back(algorithm.plan(args));
    if (c.fuse) algo::fuseReceiveReductions(plans.back());
    // Buffers the contract lets a rank pass as NULL count as empty here, so
    // a schedule that touches one fails validation.
    const bool isRoot = r == c.root;
    const bool sendAbsent =
        !isRoot && (c.kind == CollectiveKind::kBroadcast || c.kind == CollectiveKind::kScatter);
    const bool recvAbsent =
        !isRoot && (c.kind == CollectiveKind::kReduce || c.kind == CollectiveKind::kGather);
    std::string problem = algo::validate(plans.back(), sendAbsent ? 0 : algo::sendBufferBytes(args),
                                         recvAbsent ? 0 : algo::recvBufferBytes(args), es);
    ASSERT_EQ(problem, "") << describe(algorithm, c) << " rank " << r;
    auto& m = memory[r];
    switch (c.kind) {
      case CollectiveKind::kAllReduce:
      case CollectiveKind::kReduce:
      case CollectiveKind::kBroadcast:
        fill(m.send, n, r);
        m.recv.assign(n * es, 0xEE);
        if (c.inPlace && (c.kind == CollectiveKind::kAllReduce || r == c.root)) {
          m.recv = m.send;
          m.sendInRecv = 0;
        }
        break;
      case CollectiveKind::kAllGather:
      case CollectiveKind::kGather:
        fill(m.send, n, r);
        m.recv.assign(P * n * es, 0xEE);
        if (c.inPlace && (c.kind == CollectiveKind::kAllGather || r == c.root)) {
          int at = c.kind == CollectiveKind::kAllGather ? r : c.root;
          if (n) std::memcpy(m.recv.data() + at * n * es, m.send.data(), n * es);
          m.sendInRecv = static_cast<long>(at * n * es);
        }
        break;
      case CollectiveKind::kReduceScatter:
      case CollectiveKind::kScatter:
      case CollectiveKind::kAllToAll:
        fill(m.send, P * n, r);
        m.recv.assign((c.kind == CollectiveKind::kAllToAll ? P : 1) * n * es, 0xEE);
        if (c.inPlace && c.kind != CollectiveKind::kAllToAll &&
            (c.kind == CollectiveKind::kReduceScatter || r == c.root)) {
          int at = c.kind == CollectiveKind::kReduceScatter ? r : c.root;
          m.recvInSend = static_cast<long>(at * n * es);
        }
        break;
      default:
        break;
    }
  }
  for (int r = 0; r < P; ++r) {
    if (plans[r].steps.size() > 600) continue;  // quadratic: small and medium schedules only
    ASSERT_EQ(sim::findRaces(plans[r], memory[r]), "") << describe(algorithm, c) << " rank " << r;
  }
  std::string problem = sim::run(plans, memory, c.dtype, c.op);
  ASSERT_EQ(problem, "") << describe(algorithm, c);

  auto result = [&](sim::RankMemory& m, size_t i) {
    const uint8_t* base = m.recvInSend >= 0 ? m.send.data() + m.recvInSend : m.recv.data();
    return load(c.dtype, base + i * es);
  };
  auto input = [&](int rank, size_t i) { return inputValue(c.op, rank, i); };
  // The serial reference, once per case rather than once per rank: at 1024
  // ranks, recomputing it per rank was most of the test's time.
  std::vector<double> reduced;
  if (reduces(c.kind)) {
    reduced.resize(c.kind == CollectiveKind::kReduceScatter ? P * n : n);
    for (size_t i = 0; i < reduced.size(); ++i) reduced[i] = reduceOverRanks(c.dtype, c.op, P, i);
  }
  for (int r = 0; r < P; ++r) {
    auto& m = memory[r];
    for (size_t i = 0; i < n; ++i) {
      switch (c.kind) {
        case CollectiveKind::kAllReduce:
          ASSERT_EQ(result(m, i), reduced[i])
              << describe(algorithm, c) << " rank " << r << " i " << i;
          break;
        case CollectiveKind::kReduce:
          if (r == c.root) {
            ASSERT_EQ(result(m, i), reduced[i]) << describe(algorithm, c) << " i " << i;
          }
          break;
        case CollectiveKind::kBroadcast:
          ASSERT_EQ(result(m, i), input(c.root, i)) << describe(algorithm, c) << " rank " << r;
          break;
        case CollectiveKind::kAllGather:
        case CollectiveKind::kGather:
          if (c.kind == CollectiveKind::kGather && r != c.root) break;
          for (int q = 0; q < P; ++q)
            ASSERT_EQ(result(m, q * n + i), input(q, i)) << describe(algorithm, c) << " rank " << r;
          break;
        case CollectiveKind::kReduceScatter:
          ASSERT_EQ(result(m, i), reduced[r * n + i]) << describe(algorithm, c) << " rank " << r;
          break;
        case CollectiveKind::kScatter:
          ASSERT_EQ(result(m, i), input(c.root, r * n + i))
              << describe(algorithm, c) << " rank " << r;
          break;
        case CollectiveKind::kAllToAll:
          for (int q = 0; q < P; ++q)
            ASSERT_EQ(result(m, q * n + i), input(q, r * n + i))
                << describe(algorithm, c) << " rank " << r;
          break;
        default:
          break;
      }
    }
  }
}

bool rooted(CollectiveKind k) {
  return k == CollectiveKind::kBroadcast || k == CollectiveKind::kReduce ||
         k == CollectiveKind::kGather || k == CollectiveKind::kScatter;
}

// ALGO_FILTER=allreduce/butterfly (or a collective name) narrows the run.
bool selected(const algo::Algorithm& a) {
  const char* filter = std::getenv("ALGO_FILTER");
  if (!filter || !*filter) return true;
  std::string name = strCat(algo::collectiveName(a.kind), "/", a.name);
  return name.find(filter) != std::string::npos;
}

// Every algorithm x counts x chunking x in place x ops x roots, in float64,
// plus other datatypes, in place and not.
void runMatrix(int P, std::vector<size_t> counts, bool allOps, bool allRoots) {
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    if (!selected(a)) continue;
    for (size_t count : counts)
      for (size_t chunk : {size_t{1} << 19, size_t{64}})
        for (bool inPlace : {false, true}) {
          std::vector<RedOp> ops = {RedOp::kSum};
          if (reduces(a.kind) && allOps)
            ops = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};
          std::vector<int> roots = {0};
          if (rooted(a.kind))
            roots = allRoots ? std::vector<int>{0, P - 1, P / 2} : std::vector<int>{P / 2};
          for (RedOp op : ops)
            for (int root : roots) {
              runCase(a, {a.kind, P, count, DataType::kFloat64, op, root, inPlace, chunk});
              if (::testing::Test::HasFatalFailure()) return;
            }
          if (chunk == 64) {
            // Other element sizes (1, 2 and 8 bytes, at odd offsets), in
            // place too: where a rank's block starts at rank * count. int8
            // sums of up to 16 ranks stay exact.
            std::vector<std::pair<DataType, RedOp>> types = {{DataType::kFloat16, RedOp::kSum}};
            if (P <= 16) types.push_back({DataType::kInt8, RedOp::kSum});
            if (reduces(a.kind)) {
              types.push_back({DataType::kInt64, RedOp::kAvg});
              if (!inPlace)
                types.insert(types.end(), {{DataType::kInt32, RedOp::kAvg},
                                           {DataType::kInt32, RedOp::kProd},
                                           {DataType::kBfloat16, RedOp::kMax}});
              else
                types.push_back({DataType::kBfloat16, RedOp::kMax});
            }
            for (auto [t, op] : types) {
              runCase(a, {a.kind, P, count, t, op, roots.back(), inPlace, chunk});
              if (::testing::Test::HasFatalFailure()) return;
            }
          }
        }
  }
}

std::vector<size_t> countsFor(int P) {
  std::vector<size_t> counts = {0, 1, 7, 1001};
  if (P > 2) counts.push_back(static_cast<size_t>(P - 1));
  return counts;
}

class SmallWorlds : public ::testing::TestWithParam<int> {};
TEST_P(SmallWorlds, EveryAlgorithmMatchesTheSerialReference) {
  runMatrix(GetParam(), countsFor(GetParam()), true, true);
}
INSTANTIATE_TEST_SUITE_P(P, SmallWorlds, ::testing::Range(1, 18));

class LargeWorlds : public ::testing::TestWithParam<int> {};
TEST_P(LargeWorlds, EveryAlgorithmMatchesTheSerialReference) {
  runMatrix(GetParam(), countsFor(GetParam()), false, false);
}
INSTANTIATE_TEST_SUITE_P(P, LargeWorlds, ::testing::Values(31, 32, 33, 64, 100));

// A thousand ranks: every algorithm once, small counts (one of them below P).
TEST(HugeWorld, EveryAlgorithmAt1024Ranks) {
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    if (!selected(a)) continue;
    size_t count = a.kind == CollectiveKind::kAllReduce ? 1500 : 3;
    runCase(a,
            {a.kind, 1024, count, DataType::kFloat64, RedOp::kSum, 1000, false, size_t{1} << 19});
    if (HasFatalFailure()) return;
  }
}

// The schedules as the algorithms write them, before fusing: each must be
// right on its own (fusing only rewrites what it can prove equivalent).
TEST(UnfusedSchedules, EveryAlgorithmMatchesTheSerialReference) {
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    if (!selected(a)) continue;
    for (int P : {2, 3, 5, 8, 13, 33})
      for (size_t count : {size_t{1}, size_t{7}, static_cast<size_t>(P - 1), size_t{1001}})
        for (size_t chunk : {size_t{1} << 19, size_t{64}}) {
          Case c{a.kind, P, count, DataType::kFloat64, RedOp::kSum, P / 2, false, chunk};
          c.fuse = false;
          runCase(a, c);
          if (HasFatalFailure()) return;
        }
  }
}

algo::Schedule ringAllReduce(int P, int rank, size_t count) {
  return algo::findAlgorithm(CollectiveKind::kAllReduce, "ring")
      ->plan({CollectiveKind::kAllReduce, count, DataType::kFloat32, RedOp::kSum, 0, rank, P, false,
              size_t{1} << 16});
}

// A rank receiving chunks from a single child must have every receive
// posted from the start: the child sends all its chunks at once, and a chunk
// that finds no receive is held in a spill buffer and copied again (at 2
// ranks and 64 MiB that made dbtree 1.7x slower than the ring).
TEST(Dbtree, FirstChildsChunksAreReceivedWithoutWaiting) {
  for (int P : {2, 3, 6}) {
    for (int rank = 0; rank < P; ++rank) {
      algo::Schedule plan = algo::findAlgorithm(CollectiveKind::kAllReduce, "dbtree")
                                ->plan({CollectiveKind::kAllReduce, 1 << 20, DataType::kFloat32,
                                        RedOp::kSum, 0, rank, P, false, size_t{1} << 16});
      for (int t = 0; t < 2; ++t) {
        const int child = algo::dbtreeLinks(P, t, rank).children[0];
        if (child < 0) continue;
        size_t fromChild = 0;
        for (const auto& s : plan.steps) {
          if (!algo::receives(s.kind) || s.peer != child) continue;
          ++fromChild;
          // The first message from each child goes up; downward ones come from parents.
          if (s.after[0] == algo::kNoStep) continue;
          const auto& dep = plan.steps[s.after[0]];
          EXPECT_FALSE(dep.kind == algo::StepKind::kReduce ||
                       dep.kind == algo::StepKind::kRecvReduce)
              << "P=" << P << " rank " << rank << " waits for a reduction before receiving from "
              << child;
        }
        EXPECT_GT(fromChild, 0u);
      }
    }
  }
}

// At 2 ranks the root receives nothing and its peer exactly the vector:
// the textbook ring after the scatter sends the root's half back to it
// (0.78x Open MPI's Broadcast of 64 MiB over shared memory).
TEST(ScatterAllGatherBroadcast, AtTwoRanksTheRootOnlySends) {
  const algo::Algorithm* broadcast =
      algo::findAlgorithm(CollectiveKind::kBroadcast, "scatter_allgather");
  for (int root : {0, 1}) {
    for (bool inPlace : {false, true}) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{40000}}) {
        for (int rank = 0; rank < 2; ++rank) {
          algo::Schedule plan =
              broadcast->plan({CollectiveKind::kBroadcast, count, DataType::kFloat32, RedOp::kSum,
                               root, rank, 2, inPlace, size_t{1} << 12});
          size_t received = 0, sent = 0;
          for (const auto& s : plan.steps) {
            if (algo::receives(s.kind)) received += s.dst.bytes;
            if (s.kind == algo::StepKind::kSend) sent += s.src.bytes;
          }
          EXPECT_EQ(received, rank == root ? 0 : count * 4)
              << "root " << root << " rank " << rank << " inPlace " << inPlace << " count "
              << count;
          EXPECT_EQ(sent, rank == root ? count * 4 : 0)
              << "root " << root << " rank " << rank << " inPlace " << inPlace << " count "
              << count;
        }
      }
    }
  }
}

TEST(Fuse, RingReceivesAreReducedAsTheyArrive) {
  algo::Schedule plan = ringAllReduce(4, 1, 1 << 20);
  size_t recvs = 0;
  for (const auto& s : plan.steps) recvs += s.kind == algo::StepKind::kRecv;
  const size_t fused = algo::fuseReceiveReductions(plan);
  // Reduce-scatter receives fuse; allgather receives land in the output.
  EXPECT_EQ(fused, recvs / 2);
  for (const auto& s : plan.steps) {
    if (s.kind != algo::StepKind::kRecvReduce) continue;
    EXPECT_NE(s.dst.buffer, algo::BufferId::kScratch);
    EXPECT_EQ(s.src.bytes, s.dst.bytes);
  }
}

// The fused step keeps the Reduce's order of operands: where the incoming
// bytes were its left operand they stay the left one (incomingFirst). The
// ops are commutative but not to the bit (max of +0 and -0), and a planner
// that has two ranks compute one value orders the operands alike on both.
// Before, the fused step always put the local operand first.
TEST(Fuse, KeepsTheOrderOfTheReducesOperands) {
  const algo::Slice incoming{algo::BufferId::kScratch, 0, 64};
  const algo::Slice out{algo::BufferId::kRecv, 0, 64}, in{algo::BufferId::kSend, 0, 64};
  for (bool incomingLeft : {true, false}) {
    algo::Schedule plan;
    plan.scratchBytes = 64;
    auto got = plan.recv(1, incoming);
    if (incomingLeft)
      plan.reduce(out, incoming, in, got);
    else
      plan.reduce(out, in, incoming, got);
    ASSERT_EQ(algo::fuseReceiveReductions(plan), 1u);
    EXPECT_EQ(plan.steps[0].kind, algo::StepKind::kRecvReduce);
    EXPECT_EQ(plan.steps[0].incomingFirst, incomingLeft);
    EXPECT_EQ(plan.steps[0].src.buffer, algo::BufferId::kSend);
  }
}

TEST(Fuse, LeavesAPairWhoseScratchIsReadElsewhere) {
  algo::Schedule plan;
  plan.scratchBytes = 64;
  const algo::Slice incoming{algo::BufferId::kScratch, 0, 64};
  const algo::Slice out{algo::BufferId::kRecv, 0, 64}, in{algo::BufferId::kSend, 0, 64};
  auto got = plan.recv(1, incoming);
  plan.reduce(out, in, incoming, got);
  algo::Schedule forwarded = plan;
  forwarded.send(2, {algo::BufferId::kScratch, 32, 32}, got);  // reads the raw bytes
  EXPECT_EQ(algo::fuseReceiveReductions(plan), 1u);
  EXPECT_EQ(plan.steps[0].kind, algo::StepKind::kRecvReduce);
  EXPECT_EQ(algo::fuseReceiveReductions(forwarded), 0u) << "the recv has two dependents";
  algo::Schedule readLater = [&] {
    algo::Schedule p;
    p.scratchBytes = 64;
    auto r = p.recv(1, incoming);
    auto d = p.reduce(out, in, incoming, r);
    p.send(2, {algo::BufferId::kScratch, 0, 16}, d);  // a later raw read, ordered by the reduce
    return p;
  }();
  EXPECT_EQ(algo::fuseReceiveReductions(readLater), 0u);
}

TEST(Fuse, KeepsAReduceThatWaitsForMoreThanItsReceive) {
  algo::Schedule plan;
  plan.scratchBytes = 64;
  const algo::Slice incoming{algo::BufferId::kScratch, 0, 64};
  const algo::Slice out{algo::BufferId::kRecv, 0, 64}, in{algo::BufferId::kSend, 0, 64};
  auto sent = plan.send(2, out);  // the old contents of out leave first
  auto got = plan.recv(1, incoming);
  plan.reduce(out, in, incoming, got, sent);
  EXPECT_EQ(algo::fuseReceiveReductions(plan), 0u)
      << "fusing would overwrite out before the send that reads it";
}

TEST(ScheduleValidate, RejectsForwardDependency) {
  algo::Schedule s;
  s.add({algo::StepKind::kCopy,
         -1,
         {algo::BufferId::kRecv, 0, 4},
         {algo::BufferId::kSend, 0, 4},
         {},
         {1, algo::kNoStep}});
  s.copy({algo::BufferId::kRecv, 0, 4}, {algo::BufferId::kSend, 0, 4});
  EXPECT_NE(algo::validate(s, 4, 4, 4), "");
}

TEST(ScheduleValidate, RejectsOutOfBoundsSlice) {
  algo::Schedule s;
  s.copy({algo::BufferId::kRecv, 4, 8}, {algo::BufferId::kSend, 0, 8});
  EXPECT_NE(algo::validate(s, 8, 8, 4), "");
}

TEST(SimNetwork, ReportsDeadlock) {
  // Both ranks wait to receive before sending: a real deadlock.
  std::vector<algo::Schedule> plans(2);
  for (int r = 0; r < 2; ++r) {
    auto got = plans[r].recv(1 - r, {algo::BufferId::kRecv, 0, 8});
    plans[r].send(1 - r, {algo::BufferId::kSend, 0, 8}, got);
  }
  std::vector<sim::RankMemory> memory(2);
  for (auto& m : memory) m.send.assign(8, 0), m.recv.assign(8, 0);
  EXPECT_NE(sim::run(plans, memory, DataType::kFloat64, RedOp::kSum).find("deadlock"),
            std::string::npos);
}

TEST(Registry, EveryCollectiveHasADefault) {
  for (auto kind :
       {CollectiveKind::kAllReduce, CollectiveKind::kBroadcast, CollectiveKind::kReduce,
        CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllToAll,
        CollectiveKind::kGather, CollectiveKind::kScatter, CollectiveKind::kBarrier})
    EXPECT_NE(algo::defaultAlgorithm(kind), nullptr) << algo::collectiveName(kind);
  EXPECT_EQ(algo::findAlgorithm(CollectiveKind::kAllReduce, "nonsense"), nullptr);
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

TEST(SimNetwork, SendsToOnePeerGoOutInScheduleOrder) {
  // Rank 0's second send to rank 1 is ready at once, its first only after
  // a message from rank 1 that rank 1 sends after receiving the second: a
  // deadlock on real sockets, which post sends to a peer in order.
  std::vector<algo::Schedule> plans(2);
  algo::Slice eight{algo::BufferId::kSend, 0, 8};
  algo::Slice into{algo::BufferId::kRecv, 0, 8};
  auto heard = plans[0].recv(1, into);
  plans[0].send(1, eight, heard);  // k = 0, waits for rank 1
  plans[0].send(1, eight);         // k = 1, ready at once
  plans[1].recv(0, into);          // k = 0
  auto second = plans[1].recv(0, into);
  plans[1].send(0, eight, second);
  std::vector<sim::RankMemory> memory(2);
  for (auto& m : memory) m.send.assign(8, 0), m.recv.assign(8, 0);
  EXPECT_NE(sim::run(plans, memory, DataType::kFloat64, RedOp::kSum).find("deadlock"),
            std::string::npos);
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

TEST(SimNetwork, FindsARaceBetweenUnorderedSteps) {
  algo::Schedule plan;
  plan.recv(1, {algo::BufferId::kRecv, 0, 8});
  plan.send(1, {algo::BufferId::kRecv, 4, 8});  // reads what the receive writes, unordered
  sim::RankMemory m;
  m.send.assign(16, 0);
  m.recv.assign(16, 0);
  EXPECT_NE(sim::findRaces(plan, m), "");
  algo::Schedule ordered;
  auto got = ordered.recv(1, {algo::BufferId::kRecv, 0, 8});
  ordered.send(1, {algo::BufferId::kRecv, 4, 8}, got);
  EXPECT_EQ(sim::findRaces(ordered, m), "");
}

}  // namespace
}  // namespace braid
