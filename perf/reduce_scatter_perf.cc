// reduce_scatter_perf: ReduceScatter in the nccl-tests style (see
// perf_driver.h). The size is the whole send buffer; count is each rank's
// part of the result.
#include "perf_driver.h"

namespace {

using braid::perf::TestContext;

void reduceScatterInitData(const TestContext& ctx, void* send) {
  braid::perf::fillInputs(ctx, ctx.rank, 0, send, ctx.sizes.sendCount);
}

braidResult_t reduceScatterRun(const TestContext& ctx, const void* send, void* recv) {
  return braidReduceScatter(send, recv, ctx.sizes.count, ctx.type->type, ctx.op, ctx.comm,
                            ctx.stream);
}

int64_t reduceScatterCheck(const TestContext& ctx, const void* recv) {
  return braid::perf::countWrong(ctx, recv, ctx.sizes.count,
                                 static_cast<size_t>(ctx.rank) * ctx.sizes.count,
                                 braid::perf::reducedInputs(ctx));
}

constexpr braid::perf::Collective kReduceScatter = {
    .name = "reduce_scatter_perf",
    .braidName = "reducescatter",
    .usesOp = true,
    .usesRoot = false,
    .hasInPlace = true,
    .resultAtRootOnly = false,
    .sizesFor = braid::perf::scatteredSizes,
    .busBwFactor = braid::perf::partsBusBwFactor,
    .initData = reduceScatterInitData,
    .run = reduceScatterRun,
    .check = reduceScatterCheck,
};

}  // namespace

int main(int argc, char** argv) {
  return braid::perf::perfMain(argc, argv, kReduceScatter);
}
