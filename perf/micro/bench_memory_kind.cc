// What telling host from GPU memory costs a call in a process without a CUDA
// driver (every CPU-only job): each buffer of each call asks. The end-to-end
// 8-byte AllReduce takes about 1.5 us on this machine (docs/PERFORMANCE.md),
// the scale to hold these against.
#include <benchmark/benchmark.h>

#include <vector>

#include "src/memory_kind.h"

namespace {

void gpuMemoryPossibleWithoutDriver(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(braid::gpuMemoryPossible());
}
// Threads ask at once, as the threads of a process with one communicator
// each do.
BENCHMARK(gpuMemoryPossibleWithoutDriver)->ThreadRange(1, 4)->UseRealTime();

void memoryKindOfHostBuffer(benchmark::State& state) {
  std::vector<float> buffer(1024);
  for (auto _ : state) benchmark::DoNotOptimize(braid::memoryKindOf(buffer.data()));
}
BENCHMARK(memoryKindOfHostBuffer);

}  // namespace

BENCHMARK_MAIN();
