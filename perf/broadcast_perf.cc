// broadcast_perf: Broadcast in the nccl-tests style (see perf_driver.h).
#include "perf_driver.h"

namespace {

using braid::perf::TestContext;

// A pipelined broadcast delivers every byte once over each link.
double broadcastBusBwFactor(int /*nranks*/) {
  return 1.0;
}

// Every rank fills its buffer, so that data from a rank other than the root
// reads wrong.
void broadcastInitData(const TestContext& ctx, void* send) {
  braid::perf::fillDistinct(ctx, ctx.rank, 0, send, ctx.sizes.sendCount);
}

braidResult_t broadcastRun(const TestContext& ctx, const void* send, void* recv) {
  return braidBroadcast(send, recv, ctx.sizes.count, ctx.type->type, ctx.root, ctx.comm,
                        ctx.stream);
}

int64_t broadcastCheck(const TestContext& ctx, const void* recv) {
  return braid::perf::countWrongDistinct(ctx, recv, ctx.sizes.count, ctx.root, 0);
}

constexpr braid::perf::Collective kBroadcast = {
    .name = "broadcast_perf",
    .braidName = "broadcast",
    .usesOp = false,
    .usesRoot = true,
    .hasInPlace = true,
    .resultAtRootOnly = false,
    .sizesFor = [](size_t bytes, size_t eltSize,
                   int) { return braid::perf::wholeBufferSizes(bytes, eltSize); },
    .busBwFactor = broadcastBusBwFactor,
    .initData = broadcastInitData,
    .run = broadcastRun,
    .check = broadcastCheck,
};

}  // namespace

int main(int argc, char** argv) {
  return braid::perf::perfMain(argc, argv, kBroadcast);
}
