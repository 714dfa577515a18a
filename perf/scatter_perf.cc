// scatter_perf: Scatter in the nccl-tests style (see perf_driver.h). The size
// is the root's whole send buffer; count is what each rank receives.
#include "perf_driver.h"

namespace {

using braid::perf::TestContext;

// Only the root's send buffer is read.
void scatterInitData(const TestContext& ctx, void* send) {
  if (ctx.rank == ctx.root) braid::perf::fillDistinct(ctx, ctx.root, 0, send, ctx.sizes.sendCount);
}

// Out of place, the ranks other than the root pass no send buffer, which
// braid's contract allows.
braidResult_t scatterRun(const TestContext& ctx, const void* send, void* recv) {
  const void* sendAtRoot = ctx.rank == ctx.root || ctx.inPlace ? send : nullptr;
  return braidScatter(sendAtRoot, recv, ctx.sizes.count, ctx.type->type, ctx.root, ctx.comm,
                      ctx.stream);
}

int64_t scatterCheck(const TestContext& ctx, const void* recv) {
  return braid::perf::countWrongDistinct(ctx, recv, ctx.sizes.count, ctx.root,
                                         static_cast<size_t>(ctx.rank) * ctx.sizes.count);
}

constexpr braid::perf::Collective kScatter = {
    .name = "scatter_perf",
    .braidName = "scatter",
    .usesOp = false,
    .usesRoot = true,
    .hasInPlace = true,
    .resultAtRootOnly = false,
    .sizesFor = braid::perf::scatteredSizes,
    .busBwFactor = braid::perf::partsBusBwFactor,
    .initData = scatterInitData,
    .run = scatterRun,
    .check = scatterCheck,
};

}  // namespace

int main(int argc, char** argv) {
  return braid::perf::perfMain(argc, argv, kScatter);
}
