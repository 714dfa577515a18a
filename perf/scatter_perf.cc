// scatter_perf: Scatter in the nccl-tests style (see perf_driver.h). The size
// is the root's whole send buffer; count is what each rank receives.
#include "perf_driver.h"

namespace {

using braid::perf::Sizes;
using braid::perf::TestContext;

Sizes scatterSizes(size_t bytes, size_t eltSize, int nranks) {
  const size_t base = braid::perf::perRankCount(bytes, eltSize, nranks);
  const size_t total = base * static_cast<size_t>(nranks);
  return {.bytes = total * eltSize,
          .count = base,
          .sendCount = total,
          .recvCount = base,
          .sendInPlaceOffset = 0,
          .recvInPlaceOffset = base,
          .algBytes = total * eltSize};
}

// The root sends the n-1 parts it does not keep.
double scatterBusBwFactor(int nranks) {
  return static_cast<double>(nranks - 1) / nranks;
}

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
    .sizesFor = scatterSizes,
    .busBwFactor = scatterBusBwFactor,
    .initData = scatterInitData,
    .run = scatterRun,
    .check = scatterCheck,
};

}  // namespace

int main(int argc, char** argv) {
  return braid::perf::perfMain(argc, argv, kScatter);
}
