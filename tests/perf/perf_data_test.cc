// perf_data.h: the inputs the perf tests' -c check fills and the results it
// expects. The check is only as good as its data: an op computed as another,
// or a rank's block delivered to another rank, must read wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "perf/perf_driver.h"
#include "perf/perf_options.h"

namespace braid::perf {
namespace {

TestContext contextOf(const DataType& type, braidRedOp_t op, int nranks) {
  TestContext ctx{};
  ctx.type = &type;
  ctx.op = op;
  ctx.nranks = nranks;
  return ctx;
}

constexpr braidRedOp_t kOps[] = {braidSum, braidProd, braidMin, braidMax, braidAvg};

// `op` applied, here, to the inputs of every rank at `index` (the data of
// ctx.op): what a reduction that ran `op` instead would give.
double applied(const TestContext& ctx, braidRedOp_t op, size_t index) {
  double result = op == braidProd ? 1 : 0;
  for (int rank = 0; rank < ctx.nranks; ++rank) {
    const auto value = static_cast<double>(inputValue(ctx, rank, index));
    if (rank == 0 && (op == braidMin || op == braidMax)) result = value;
    switch (op) {
      case braidProd:
        result *= value;
        break;
      case braidMin:
        result = std::min(result, value);
        break;
      case braidMax:
        result = std::max(result, value);
        break;
      default:
        result += value;
    }
  }
  if (op == braidAvg)
    result = ctx.type->isFloat ? result / ctx.nranks : std::trunc(result / ctx.nranks);
  return result;
}

// On each op's data, every other op gives other results somewhere in the
// first elements, at every world size: a reduction that ran the wrong op
// reads wrong. Before, on prod's data, min gave prod's results at 2 and 3
// ranks (signed types) and max up to 5 ranks (unsigned).
TEST(PerfData, NoOtherOpGivesTheExpectedResults) {
  for (const DataType& type : dataTypes())
    for (int nranks = 2; nranks <= 8; ++nranks)
      for (braidRedOp_t op : kOps) {
        const TestContext ctx = contextOf(type, op, nranks);
        const auto expected = reducedInputs(ctx);
        for (braidRedOp_t other : kOps) {
          if (other == op) continue;
          // Integer avg of these small sums truncates toward sum / n, which
          // may equal another op's everywhere at one rank count; it is told
          // apart by the division, checked with the other ops' data.
          bool differ = false;
          for (size_t i = 0; i < 1024 && !differ; ++i) {
            const Expected e = expected(i);
            const double want = type.isFloat ? e.real : static_cast<double>(e.integer);
            differ = applied(ctx, other, i) != want;
          }
          EXPECT_TRUE(differ) << type.name << ", " << nranks << " ranks: on the data of op " << op
                              << ", op " << other << " gives the expected results";
        }
      }
}

// A rank's block of a ReduceScatter (or of any reduction) differs from the
// next rank's wherever the blocks are cut: the data has no period that a
// block size could be a multiple of. Before, it repeated every 3 to 11
// elements, and a block of 44 floats went to the wrong rank unseen.
TEST(PerfData, NoBlockOfAReductionEqualsTheNext) {
  for (const DataType& type : dataTypes())
    for (braidRedOp_t op : kOps)
      for (int nranks : {2, 3, 4})
        for (size_t count : {1u, 2u, 3u, 5u, 6u, 8u, 11u, 44u, 48u, 168u, 1000u, 10920u}) {
          const auto expected = reducedInputs(contextOf(type, op, nranks));
          size_t differing = 0;
          for (size_t i = 0; i < count; ++i) {
            const Expected x = expected(i), y = expected(count + i);
            differing += type.isFloat ? x.real != y.real : x.integer != y.integer;
          }
          // Tiny blocks may match by chance; larger ones differ somewhere.
          if (count >= 8) {
            EXPECT_GE(differing, 1u)
                << type.name << ", op " << op << ", " << nranks << " ranks, blocks of " << count;
          }
        }
}

// What fillInputs writes is what inputValue says, and the expected results
// are those of the inputs, at any offset.
TEST(PerfData, FilledInputsAndExpectedResultsAgree) {
  for (const DataType& type : dataTypes())
    for (braidRedOp_t op : kOps) {
      const TestContext ctx = contextOf(type, op, 3);
      std::vector<unsigned char> buffer(300 * type.size);
      for (int rank = 0; rank < 3; ++rank) {
        fillInputs(ctx, rank, 1000, buffer.data(), 300);
        const auto input = [&](size_t index) { return copiedInput(ctx, rank, index); };
        EXPECT_EQ(countWrong(ctx, buffer.data(), 300, 1000, input), 0)
            << type.name << ", op " << op << ", rank " << rank;
      }
    }
}

}  // namespace
}  // namespace braid::perf
