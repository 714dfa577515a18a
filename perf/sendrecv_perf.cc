// sendrecv_perf: Send/Recv in a ring (rank r sends to r+1 and receives from
// r-1, in one group), in the nccl-tests style (see perf_driver.h). braid has
// no in-place Send/Recv, so the in-place columns read N/A.
#include "perf_driver.h"

namespace {

using braid::perf::TestContext;

// One transfer per link.
double sendRecvBusBwFactor(int /*nranks*/) {
  return 1.0;
}

void sendRecvInitData(const TestContext& ctx, void* send) {
  braid::perf::fillDistinct(ctx, ctx.rank, 0, send, ctx.sizes.sendCount);
}

braidResult_t sendRecvRun(const TestContext& ctx, const void* send, void* recv) {
  const int next = (ctx.rank + 1) % ctx.nranks;
  const int previous = (ctx.rank - 1 + ctx.nranks) % ctx.nranks;
  braidResult_t result = braidGroupStart();
  if (result != braidSuccess) return result;
  braidResult_t sent = braidSend(send, ctx.sizes.count, ctx.type->type, next, ctx.comm, ctx.stream);
  braidResult_t received =
      braidRecv(recv, ctx.sizes.count, ctx.type->type, previous, ctx.comm, ctx.stream);
  // Closed whatever happened, so that a failed call leaves no group open.
  result = braidGroupEnd();
  if (sent != braidSuccess) return sent;
  if (received != braidSuccess) return received;
  return result;
}

int64_t sendRecvCheck(const TestContext& ctx, const void* recv) {
  const int previous = (ctx.rank - 1 + ctx.nranks) % ctx.nranks;
  return braid::perf::countWrongDistinct(ctx, recv, ctx.sizes.count, previous, 0);
}

constexpr braid::perf::Collective kSendRecv = {
    .name = "sendrecv_perf",
    .braidName = nullptr,
    .usesOp = false,
    .usesRoot = false,
    .hasInPlace = false,
    .resultAtRootOnly = false,
    .sizesFor = [](size_t bytes, size_t eltSize,
                   int) { return braid::perf::wholeBufferSizes(bytes, eltSize); },
    .busBwFactor = sendRecvBusBwFactor,
    .initData = sendRecvInitData,
    .run = sendRecvRun,
    .check = sendRecvCheck,
};

}  // namespace

int main(int argc, char** argv) {
  return braid::perf::perfMain(argc, argv, kSendRecv);
}
