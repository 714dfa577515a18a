// AllReduce must give every rank the same bits, not only the same value:
// max of +0 and -0, and which NaN payload a sum keeps, depend on the order a
// pair is combined in. Checked for every AllReduce algorithm across ranks
// (not against a serial reference, whose association differs), in place or
// not, with and without the receive fusion the engine applies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/fuse.h"
#include "tests/harness/sim_network.h"

namespace braid {
namespace {

using algo::CollectiveKind;

TEST(AllReduce, EveryAlgorithmsRanksAgreeToTheBit) {
  size_t algorithms = 0;
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    if (a.kind != CollectiveKind::kAllReduce) continue;
    ++algorithms;
    for (size_t count : {size_t{8}, size_t{3}, size_t{37}})
      for (int P : {2, 3, 4, 5, 8})
        for (RedOp op : {RedOp::kMax, RedOp::kMin, RedOp::kSum})
          for (bool inPlace : {false, true})
            for (bool fuse : {false, true}) {
              std::vector<algo::Schedule> plans;
              std::vector<sim::RankMemory> memory(P);
              for (int r = 0; r < P; ++r) {
                // Chunks of 8 bytes: every algorithm cuts and pipelines.
                plans.push_back(a.plan({CollectiveKind::kAllReduce, count, DataType::kFloat32, op,
                                        0, r, P, inPlace, 8}));
                if (fuse) algo::fuseReceiveReductions(plans.back());
                std::vector<uint32_t> bits(count);
                for (size_t i = 0; i < count; ++i) {
                  // Signed zeros that differ from rank to rank, and NaNs
                  // whose payload names the rank.
                  bits[i] = i % 2 ? ((r + i) % 2 ? 0x80000000u : 0u)
                                  : 0x7fc00000u | static_cast<uint32_t>(r + 1);
                }
                sim::RankMemory& m = memory[r];
                m.send.resize(count * 4);
                std::memcpy(m.send.data(), bits.data(), count * 4);
                m.recv.assign(count * 4, 0xEE);
                if (inPlace) {
                  m.recv = m.send;
                  m.sendInRecv = 0;
                }
              }
              ASSERT_EQ(sim::run(plans, memory, DataType::kFloat32, op), "") << a.name;
              for (int r = 1; r < P; ++r)
                EXPECT_EQ(std::memcmp(memory[r].recv.data(), memory[0].recv.data(), count * 4), 0)
                    << a.name << ", P=" << P << ", count " << count << ", op "
                    << static_cast<int>(op) << (inPlace ? ", in place" : "")
                    << (fuse ? ", fused" : "") << ": rank " << r << " differs from rank 0";
            }
  }
  EXPECT_GE(algorithms, 4u);  // ring, butterfly, halving, dbtree at least
}

// Max and min give every rank a NaN where any one rank had it, whichever
// rank that is and wherever the algorithm puts its element.
TEST(AllReduce, MaxAndMinKeepANaNThatOneRankHas) {
  for (const algo::Algorithm& a : algo::allAlgorithms()) {
    if (a.kind != CollectiveKind::kAllReduce) continue;
    for (size_t count : {size_t{8}, size_t{37}})
      for (int P : {2, 3, 5, 8})
        for (int holder = 0; holder < P; ++holder)
          for (RedOp op : {RedOp::kMax, RedOp::kMin}) {
            std::vector<algo::Schedule> plans;
            std::vector<sim::RankMemory> memory(P);
            for (int r = 0; r < P; ++r) {
              plans.push_back(a.plan(
                  {CollectiveKind::kAllReduce, count, DataType::kFloat32, op, 0, r, P, false, 8}));
              std::vector<float> values(count, static_cast<float>(r + 1));
              if (r == holder) values.assign(count, std::numeric_limits<float>::quiet_NaN());
              sim::RankMemory& m = memory[r];
              m.send.resize(count * 4);
              std::memcpy(m.send.data(), values.data(), count * 4);
              m.recv.assign(count * 4, 0xEE);
            }
            ASSERT_EQ(sim::run(plans, memory, DataType::kFloat32, op), "") << a.name;
            for (int r = 0; r < P; ++r) {
              std::vector<float> got(count);
              std::memcpy(got.data(), memory[r].recv.data(), count * 4);
              for (size_t i = 0; i < count; ++i)
                ASSERT_TRUE(std::isnan(got[i]))
                    << a.name << ", P=" << P << ", count " << count << ", op "
                    << static_cast<int>(op) << ", NaN on rank " << holder << ": rank " << r
                    << " has " << got[i] << " at " << i;
            }
          }
  }
}

}  // namespace
}  // namespace braid
