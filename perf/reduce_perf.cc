// reduce_perf: Reduce in the nccl-tests style (see perf_driver.h).
#include "perf_driver.h"

namespace {

using braid::perf::TestContext;

// A pipelined reduce carries every byte once over each link.
double reduceBusBwFactor(int /*nranks*/) {
  return 1.0;
}

void reduceInitData(const TestContext& ctx, void* send) {
  braid::perf::fillInputs(ctx, ctx.rank, 0, send, ctx.sizes.sendCount);
}

braidResult_t reduceRun(const TestContext& ctx, const void* send, void* recv) {
  return braidReduce(send, recv, ctx.sizes.count, ctx.type->type, ctx.op, ctx.root, ctx.comm,
                     ctx.stream);
}

// Only the root has a result.
int64_t reduceCheck(const TestContext& ctx, const void* recv) {
  if (ctx.rank != ctx.root) return 0;
  return braid::perf::countWrong(ctx, recv, ctx.sizes.count, 0, braid::perf::reducedInputs(ctx));
}

constexpr braid::perf::Collective kReduce = {
    .name = "reduce_perf",
    .braidName = "reduce",
    .usesOp = true,
    .usesRoot = true,
    .hasInPlace = true,
    .resultAtRootOnly = true,
    .sizesFor = [](size_t bytes, size_t eltSize,
                   int) { return braid::perf::wholeBufferSizes(bytes, eltSize); },
    .busBwFactor = reduceBusBwFactor,
    .initData = reduceInitData,
    .run = reduceRun,
    .check = reduceCheck,
};

}  // namespace

int main(int argc, char** argv) {
  return braid::perf::perfMain(argc, argv, kReduce);
}
