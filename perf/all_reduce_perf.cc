// all_reduce_perf: AllReduce in the nccl-tests style (see perf_driver.h).
#include "perf_driver.h"

namespace {

using braid::perf::TestContext;

// Each element crosses 2(n-1)/n links' worth of traffic (a reduce-scatter
// and an all-gather), so busbw compares with the link bandwidth for any n.
double allReduceBusBwFactor(int nranks) {
  return 2.0 * (nranks - 1) / nranks;
}

void allReduceInitData(const TestContext& ctx, void* send) {
  braid::perf::fillInputs(ctx, ctx.rank, 0, send, ctx.sizes.sendCount);
}

braidResult_t allReduceRun(const TestContext& ctx, const void* send, void* recv) {
  return braidAllReduce(send, recv, ctx.sizes.count, ctx.type->type, ctx.op, ctx.comm, ctx.stream);
}

int64_t allReduceCheck(const TestContext& ctx, const void* recv) {
  return braid::perf::countWrong(ctx, recv, ctx.sizes.count, 0, braid::perf::reducedInputs(ctx));
}

constexpr braid::perf::Collective kAllReduce = {
    .name = "all_reduce_perf",
    .braidName = "allreduce",
    .usesOp = true,
    .usesRoot = false,
    .hasInPlace = true,
    .resultAtRootOnly = false,
    .sizesFor = [](size_t bytes, size_t eltSize,
                   int) { return braid::perf::wholeBufferSizes(bytes, eltSize); },
    .busBwFactor = allReduceBusBwFactor,
    .initData = allReduceInitData,
    .run = allReduceRun,
    .check = allReduceCheck,
};

}  // namespace

int main(int argc, char** argv) {
  return braid::perf::perfMain(argc, argv, kAllReduce);
}
