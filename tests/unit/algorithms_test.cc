// Every registered algorithm, run for many world sizes on the simulated
// network, against a serial reference; plus the schedule invariants.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "algorithms/algorithm.h"
#include "src/common/reduce.h"
#include "src/common/strcat.h"
#include "tests/harness/sim_network.h"

namespace braid {
namespace {

using algo::CollectiveArgs;
using algo::CollectiveKind;

// Small integers: every partial result is exact in every type used here.
double inputValue(int rank, size_t i) {
  return static_cast<double>((rank * 7 + i * 3) % 5) - 1;
}

template <typename T>
void fill(std::vector<uint8_t>& bytes, size_t count, size_t offset, int rank) {
  for (size_t i = 0; i < count; ++i) {
    T v = static_cast<T>(inputValue(rank, offset + i));
    std::memcpy(bytes.data() + (offset + i) * sizeof(T), &v, sizeof(T));
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

double reduceOverRanks(RedOp op, int P, size_t i) {
  double acc = inputValue(0, i);
  for (int r = 1; r < P; ++r) acc = combine(op, acc, inputValue(r, i));
  if (op == RedOp::kAvg) acc /= P;
  return acc;
}

struct Case {
  CollectiveKind kind;
  int P;
  size_t count;
  RedOp op;
  int root;
  bool inPlace;
  size_t chunkBytes;
};

std::string describe(const algo::Algorithm& a, const Case& c) {
  return strCat(algo::collectiveName(c.kind), "/", a.name, " P=", c.P, " count=", c.count,
                " op=", redOpName(c.op), " root=", c.root, c.inPlace ? " in-place" : "",
                " chunk=", c.chunkBytes);
}

// float64 values; expected results computed per collective.
void runCase(const algo::Algorithm& algorithm, const Case& c) {
  using T = double;
  const size_t es = sizeof(T);
  const int P = c.P;
  std::vector<algo::Schedule> plans;
  std::vector<sim::RankMemory> memory(P);
  for (int r = 0; r < P; ++r) {
    CollectiveArgs args{c.kind, c.count, DataType::kFloat64, c.op,        c.root,
                        r,      P,       c.inPlace,          c.chunkBytes};
    plans.push_back(algorithm.plan(args));
    std::string problem =
        algo::validate(plans.back(), algo::sendBufferBytes(args), algo::recvBufferBytes(args), es);
    ASSERT_EQ(problem, "") << describe(algorithm, c) << " rank " << r;
    auto& m = memory[r];
    const size_t n = c.count;
    switch (c.kind) {
      case CollectiveKind::kAllReduce:
      case CollectiveKind::kReduce:
      case CollectiveKind::kBroadcast:
        m.send.assign(n * es, 0);
        fill<T>(m.send, n, 0, r);
        m.recv.assign(n * es, 0xEE);
        if (c.inPlace && (c.kind == CollectiveKind::kAllReduce || r == c.root)) {
          m.recv = m.send;
          m.sendInRecv = 0;
        }
        break;
      case CollectiveKind::kAllGather:
      case CollectiveKind::kGather:
        m.send.assign(n * es, 0);
        fill<T>(m.send, n, 0, r);
        m.recv.assign(P * n * es, 0xEE);
        if (c.inPlace && (c.kind == CollectiveKind::kAllGather || r == c.root)) {
          int at = c.kind == CollectiveKind::kAllGather ? r : c.root;
          std::memcpy(m.recv.data() + at * n * es, m.send.data(), n * es);
          m.sendInRecv = static_cast<long>(at * n * es);
        }
        break;
      case CollectiveKind::kReduceScatter:
      case CollectiveKind::kScatter:
      case CollectiveKind::kAllToAll:
        m.send.assign(P * n * es, 0);
        fill<T>(m.send, P * n, 0, r);
        m.recv.assign(n * es, 0xEE);
        if (c.kind == CollectiveKind::kAllToAll) m.recv.assign(P * n * es, 0xEE);
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
  std::string problem = sim::run(plans, memory, DataType::kFloat64, c.op);
  ASSERT_EQ(problem, "") << describe(algorithm, c);

  auto value = [&](sim::RankMemory& m, bool fromSend, size_t i) {
    T v;
    const uint8_t* base =
        fromSend ? m.send.data()
                 : (m.sendInRecv >= 0 || m.recvInSend < 0 ? m.recv.data()
                                                          : m.send.data() + m.recvInSend);
    std::memcpy(&v, base + i * es, es);
    return v;
  };
  const size_t n = c.count;
  for (int r = 0; r < P; ++r) {
    auto& m = memory[r];
    for (size_t i = 0; i < n; ++i) {
      switch (c.kind) {
        case CollectiveKind::kAllReduce:
          ASSERT_EQ(value(m, false, i), reduceOverRanks(c.op, P, i))
              << describe(algorithm, c) << " rank " << r << " i " << i;
          break;
        case CollectiveKind::kReduce:
          if (r == c.root) {
            ASSERT_EQ(value(m, false, i), reduceOverRanks(c.op, P, i))
                << describe(algorithm, c) << " i " << i;
          }
          break;
        case CollectiveKind::kBroadcast:
          ASSERT_EQ(value(m, false, i), inputValue(c.root, i))
              << describe(algorithm, c) << " rank " << r;
          break;
        case CollectiveKind::kAllGather:
        case CollectiveKind::kGather:
          if (c.kind == CollectiveKind::kGather && r != c.root) break;
          for (int q = 0; q < P; ++q)
            ASSERT_EQ(value(m, false, q * n + i), inputValue(q, i))
                << describe(algorithm, c) << " rank " << r;
          break;
        case CollectiveKind::kReduceScatter:
          ASSERT_EQ(value(m, false, i), reduceOverRanks(c.op, P, r * n + i))
              << describe(algorithm, c) << " rank " << r;
          break;
        case CollectiveKind::kScatter:
          ASSERT_EQ(value(m, false, i), inputValue(c.root, r * n + i))
              << describe(algorithm, c) << " rank " << r;
          break;
        case CollectiveKind::kAllToAll:
          for (int q = 0; q < P; ++q)
            ASSERT_EQ(value(m, false, q * n + i), inputValue(q, r * n + i))
                << describe(algorithm, c) << " rank " << r;
          break;
        default:
          break;
      }
    }
  }
}

bool reduces(CollectiveKind k) {
  return k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduce ||
         k == CollectiveKind::kReduceScatter;
}
bool rooted(CollectiveKind k) {
  return k == CollectiveKind::kBroadcast || k == CollectiveKind::kReduce ||
         k == CollectiveKind::kGather || k == CollectiveKind::kScatter;
}

class AlgorithmTest : public ::testing::TestWithParam<int> {};

TEST_P(AlgorithmTest, MatchesSerialReference) {
  const int P = GetParam();
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    std::vector<size_t> counts = {1, 7, 1000};
    if (P > 1) counts.push_back(static_cast<size_t>(P - 1));
    for (size_t count : counts)
      for (size_t chunk : {size_t{1} << 19, size_t{64}})
        for (bool inPlace : {false, true}) {
          std::vector<RedOp> ops = {RedOp::kSum};
          if (reduces(a.kind))
            ops = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};
          std::vector<int> roots = {0};
          if (rooted(a.kind)) roots = {0, P - 1, P / 2};
          for (RedOp op : ops)
            for (int root : roots) {
              runCase(a, {a.kind, P, count, op, root, inPlace, chunk});
              if (HasFatalFailure()) return;
            }
        }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AlgorithmTest,
                         ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 31, 32, 33, 64));

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
