// What mismatch detection costs a small message. Three things run for it and
// nothing else: the call's signature is packed once per call, each frame's
// check word is compared with the posted receive's (inside matching, timed
// here as the whole 8-byte round trip with and without a second message in
// flight), and after each call every connection is asked whether it holds a
// message of the call nobody claimed. The end-to-end 8-byte AllReduce takes
// about 1.5 us on this machine (docs/PERFORMANCE.md), the scale to hold
// these against.
#include <benchmark/benchmark.h>

#include <memory>

#include "src/progress.h"
#include "tcp_pair.h"

namespace {

using braid::CallSignature;

void packSignature(benchmark::State& state) {
  CallSignature signature{0, braid::DataType::kFloat32, braid::RedOp::kSum, -1, 2};
  for (auto _ : state) {
    benchmark::DoNotOptimize(signature);
    benchmark::DoNotOptimize(signature.pack());
    ++signature.count;
  }
}
BENCHMARK(packSignature);

// The per-call scan, on a connection with nothing unclaimed (the common case).
void unclaimedScan(benchmark::State& state) {
  braid::bench::LoopbackPair pair;
  uint64_t below = (uint64_t{1} << 56) | 1000;
  for (auto _ : state) {
    benchmark::DoNotOptimize(pair.a->unclaimed(1, below));
    ++below;
  }
}
BENCHMARK(unclaimedScan);

}  // namespace

BENCHMARK_MAIN();
