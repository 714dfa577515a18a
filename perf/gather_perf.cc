// gather_perf: Gather in the nccl-tests style (see perf_driver.h). The size
// is the root's whole receive buffer; count is what each rank sends.
#include "perf_driver.h"

namespace {

using braid::perf::TestContext;

void gatherInitData(const TestContext& ctx, void* send) {
  braid::perf::fillDistinct(ctx, ctx.rank, 0, send, ctx.sizes.sendCount);
}

// Out of place, the ranks other than the root pass no receive buffer, which
// braid's contract allows.
braidResult_t gatherRun(const TestContext& ctx, const void* send, void* recv) {
  void* recvAtRoot = ctx.rank == ctx.root || ctx.inPlace ? recv : nullptr;
  return braidGather(send, recvAtRoot, ctx.sizes.count, ctx.type->type, ctx.root, ctx.comm,
                     ctx.stream);
}

int64_t gatherCheck(const TestContext& ctx, const void* recv) {
  if (ctx.rank != ctx.root) return 0;
  int64_t wrong = 0;
  for (int r = 0; r < ctx.nranks; ++r) {
    const void* part = braid::perf::elementAt(ctx, recv, static_cast<size_t>(r) * ctx.sizes.count);
    wrong += braid::perf::countWrongDistinct(ctx, part, ctx.sizes.count, r, 0);
  }
  return wrong;
}

constexpr braid::perf::Collective kGather = {
    .name = "gather_perf",
    .braidName = "gather",
    .usesOp = false,
    .usesRoot = true,
    .hasInPlace = true,
    .resultAtRootOnly = true,
    .sizesFor = braid::perf::gatheredSizes,
    .busBwFactor = braid::perf::partsBusBwFactor,
    .initData = gatherInitData,
    .run = gatherRun,
    .check = gatherCheck,
};

}  // namespace

int main(int argc, char** argv) {
  return braid::perf::perfMain(argc, argv, kGather);
}
