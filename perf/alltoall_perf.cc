// alltoall_perf: AllToAll in the nccl-tests style (see perf_driver.h). The
// size is the whole send buffer; count is what goes to each rank. braid's
// AllToAll is never in place, so the in-place columns read N/A.
#include "perf_driver.h"

namespace {

using braid::perf::Sizes;
using braid::perf::TestContext;

Sizes allToAllSizes(size_t bytes, size_t eltSize, int nranks) {
  const size_t base = braid::perf::perRankCount(bytes, eltSize, nranks);
  const size_t total = base * static_cast<size_t>(nranks);
  return {.bytes = total * eltSize,
          .count = base,
          .sendCount = total,
          .recvCount = total,
          .sendInPlaceOffset = 0,
          .recvInPlaceOffset = 0,
          .algBytes = total * eltSize};
}

// Part j of rank r's send buffer holds elements j*count.. of rank r's data.
void allToAllInitData(const TestContext& ctx, void* send) {
  braid::perf::fillDistinct(ctx, ctx.rank, 0, send, ctx.sizes.sendCount);
}

braidResult_t allToAllRun(const TestContext& ctx, const void* send, void* recv) {
  return braidAllToAll(send, recv, ctx.sizes.count, ctx.type->type, ctx.comm, ctx.stream);
}

// Part r of this rank's result is part `rank` of rank r's send buffer.
int64_t allToAllCheck(const TestContext& ctx, const void* recv) {
  int64_t wrong = 0;
  const size_t count = ctx.sizes.count;
  for (int r = 0; r < ctx.nranks; ++r) {
    const void* part = braid::perf::elementAt(ctx, recv, static_cast<size_t>(r) * count);
    wrong +=
        braid::perf::countWrongDistinct(ctx, part, count, r, static_cast<size_t>(ctx.rank) * count);
  }
  return wrong;
}

constexpr braid::perf::Collective kAllToAll = {
    .name = "alltoall_perf",
    .braidName = "alltoall",
    .usesOp = false,
    .usesRoot = false,
    .hasInPlace = false,
    .resultAtRootOnly = false,
    .sizesFor = allToAllSizes,
    .busBwFactor = braid::perf::partsBusBwFactor,
    .initData = allToAllInitData,
    .run = allToAllRun,
    .check = allToAllCheck,
};

}  // namespace

int main(int argc, char** argv) {
  return braid::perf::perfMain(argc, argv, kAllToAll);
}
