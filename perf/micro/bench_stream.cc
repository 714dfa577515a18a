// What handing a call to a braid stream costs: a one-rank communicator (no
// peer to wait for, so the hand-off is all there is) runs a 64-byte
// AllReduce on the caller's thread, and on a stream followed by
// braidStreamSynchronize, which wakes the stream's worker and then the
// caller; and a batch of them waited for once. Run it with the cores it
// may use (taskset): with two or more the worker and the waiter poll before
// they sleep (src/stream.h), with one they sleep at once.
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

// A batch of calls queued on a stream and waited for once, as a framework
// queues its small collectives: the worker runs them back to back while
// the caller waits, so what a call costs beyond callerThread is the
// hand-off through the queue (and any wake-up of the waiter on the way).
void streamBatch(benchmark::State& state) {
  braidComm_t comm = oneRankComm();
  braidStream_t stream = nullptr;
  if (braidStreamCreate(comm, &stream) != braidSuccess) {
    state.SkipWithError(braidGetLastError(nullptr));
    return;
  }
  const int64_t batch = state.range(0);
  float x[16] = {};
  for (auto _ : state) {
    for (int64_t i = 0; i < batch; ++i)
      if (braidAllReduce(x, x, 16, braidFloat32, braidSum, comm, stream) != braidSuccess)
        state.SkipWithError(braidGetLastError(nullptr));
    if (braidStreamSynchronize(stream) != braidSuccess)
      state.SkipWithError(braidGetLastError(nullptr));
  }
  state.SetItemsProcessed(state.iterations() * batch);
  braidStreamDestroy(stream);
}
BENCHMARK(streamBatch)->Arg(64);

}  // namespace

BENCHMARK_MAIN();
