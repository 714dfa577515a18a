// all_gather_perf: AllGather in the nccl-tests style (see perf_driver.h).
// The size is the whole gathered buffer; count is what each rank sends.
#include "perf_driver.h"

namespace {

using braid::perf::TestContext;

void allGatherInitData(const TestContext& ctx, void* send) {
  braid::perf::fillDistinct(ctx, ctx.rank, 0, send, ctx.sizes.sendCount);
}

braidResult_t allGatherRun(const TestContext& ctx, const void* send, void* recv) {
  return braidAllGather(send, recv, ctx.sizes.count, ctx.type->type, ctx.comm, ctx.stream);
}

int64_t allGatherCheck(const TestContext& ctx, const void* recv) {
  int64_t wrong = 0;
  for (int r = 0; r < ctx.nranks; ++r) {
    const void* part = braid::perf::elementAt(ctx, recv, static_cast<size_t>(r) * ctx.sizes.count);
    wrong += braid::perf::countWrongDistinct(ctx, part, ctx.sizes.count, r, 0);
  }
  return wrong;
}

constexpr braid::perf::Collective kAllGather = {
    .name = "all_gather_perf",
    .braidName = "allgather",
    .usesOp = false,
    .usesRoot = false,
    .hasInPlace = true,
    .resultAtRootOnly = false,
    .sizesFor = braid::perf::gatheredSizes,
    .busBwFactor = braid::perf::partsBusBwFactor,
    .initData = allGatherInitData,
    .run = allGatherRun,
    .check = allGatherCheck,
};

}  // namespace

int main(int argc, char** argv) {
  return braid::perf::perfMain(argc, argv, kAllGather);
}
