// all_gather_perf: AllGather in the nccl-tests style (see perf_driver.h).
// The size is the whole gathered buffer; count is what each rank sends.
#include "perf_driver.h"

namespace {

using braid::perf::Sizes;
using braid::perf::TestContext;

Sizes allGatherSizes(size_t bytes, size_t eltSize, int nranks) {
  const size_t base = braid::perf::perRankCount(bytes, eltSize, nranks);
  const size_t total = base * static_cast<size_t>(nranks);
  return {.bytes = total * eltSize,
          .count = base,
          .sendCount = base,
          .recvCount = total,
          .sendInPlaceOffset = base,
          .recvInPlaceOffset = 0,
          .algBytes = total * eltSize};
}

// Each rank receives the n-1 parts it does not hold.
double allGatherBusBwFactor(int nranks) {
  return static_cast<double>(nranks - 1) / nranks;
}

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
    .sizesFor = allGatherSizes,
    .busBwFactor = allGatherBusBwFactor,
    .initData = allGatherInitData,
    .run = allGatherRun,
    .check = allGatherCheck,
};

}  // namespace

int main(int argc, char** argv) {
  return braid::perf::perfMain(argc, argv, kAllGather);
}
