// One TCP connection pair over loopback, driven by hand: round-trip latency
// and one-way bandwidth of the transport alone (no schedule, no engine).
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "tcp_pair.h"

namespace {

using braid::bench::LoopbackPair;
using braid::transport::Tag;

void roundTrip(benchmark::State& state) {
  LoopbackPair pair;
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> out(bytes, 1), in(bytes);
  uint64_t tag = 0;
  for (auto _ : state) {
    ++tag;
    pair.drive(pair.a->postSend(out.data(), bytes, {tag, 0}),
               pair.b->postRecv(in.data(), bytes, {tag, 0}));
    pair.drive(pair.b->postSend(in.data(), bytes, {tag, 0}),
               pair.a->postRecv(out.data(), bytes, {tag, 0}));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * bytes));
}
BENCHMARK(roundTrip)->Arg(8)->Arg(4096)->Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20);

}  // namespace

BENCHMARK_MAIN();
