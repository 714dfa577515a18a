// How long an algorithm takes to plan one rank's schedule: this is paid on
// every call, so it must stay far below a call's network time.
#include <benchmark/benchmark.h>

#include "algorithms/algorithm.h"

namespace {

using braid::algo::CollectiveArgs;
using braid::algo::CollectiveKind;

void planAllReduceRing(benchmark::State& state) {
  CollectiveArgs args;
  args.kind = CollectiveKind::kAllReduce;
  args.nranks = static_cast<int>(state.range(0));
  args.count = static_cast<size_t>(state.range(1)) / 4;
  args.rank = 1;
  for (auto _ : state) benchmark::DoNotOptimize(braid::algo::planAllReduceRing(args));
  state.SetLabel(std::to_string(braid::algo::planAllReduceRing(args).steps.size()) + " steps");
}
BENCHMARK(planAllReduceRing)->ArgsProduct({{2, 8, 64}, {8, 1 << 20, 64 << 20}});

void planBroadcastTree(benchmark::State& state) {
  CollectiveArgs args;
  args.kind = CollectiveKind::kBroadcast;
  args.nranks = static_cast<int>(state.range(0));
  args.count = static_cast<size_t>(state.range(1)) / 4;
  args.rank = 3;
  for (auto _ : state) benchmark::DoNotOptimize(braid::algo::planBroadcastTree(args));
}
BENCHMARK(planBroadcastTree)->ArgsProduct({{8, 64}, {8, 64 << 20}});

}  // namespace

BENCHMARK_MAIN();
