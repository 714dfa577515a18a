// What handing a call to a braid stream costs: a one-rank communicator (no
// peer to wait for, so the hand-off is all there is) runs a 64-byte
// AllReduce on the caller's thread, and on a stream followed by
// braidStreamSynchronize, which wakes the stream's worker and then the
// caller. Run it with the cores it may use (taskset): with two or more the
// worker and the waiter poll before they sleep (src/stream.h), with one
// they sleep at once.
#include <benchmark/benchmark.h>
#include <braid.h>

#include <cstdio>
#include <cstdlib>

namespace {

braidComm_t oneRankComm() {
  static braidComm_t comm = [] {
    braidUniqueId id;
    braidComm_t c = nullptr;
    if (braidGetUniqueId(&id) != braidSuccess || braidCommInitRank(&c, 1, id, 0) != braidSuccess) {
      std::fprintf(stderr, "bench_stream: %s\n", braidGetLastError(nullptr));
      std::exit(1);
    }
    return c;
  }();
  return comm;
}

void callerThread(benchmark::State& state) {
  braidComm_t comm = oneRankComm();
  float x[16] = {};
  for (auto _ : state)
    if (braidAllReduce(x, x, 16, braidFloat32, braidSum, comm, nullptr) != braidSuccess)
      state.SkipWithError(braidGetLastError(nullptr));
}
BENCHMARK(callerThread);

void streamAndSynchronize(benchmark::State& state) {
  braidComm_t comm = oneRankComm();
  braidStream_t stream = nullptr;
  if (braidStreamCreate(comm, &stream) != braidSuccess) {
    state.SkipWithError(braidGetLastError(nullptr));
    return;
  }
  float x[16] = {};
  for (auto _ : state) {
    if (braidAllReduce(x, x, 16, braidFloat32, braidSum, comm, stream) != braidSuccess ||
        braidStreamSynchronize(stream) != braidSuccess)
      state.SkipWithError(braidGetLastError(nullptr));
  }
  braidStreamDestroy(stream);
}
BENCHMARK(streamAndSynchronize);

}  // namespace

BENCHMARK_MAIN();
