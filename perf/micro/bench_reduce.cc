// Throughput of the host reduction kernels, to see whether a reducing
// collective is bound by the wire or by the arithmetic on this machine.
// bytes_per_second counts one operand (the message size, as collectives count
// it); the kernel moves three times that through memory (read a, read b,
// write dst). Sizes span L1-resident to DRAM-bound buffers.
//
// memcpy of the same operand size is the baseline: the ratio reduce/memcpy
// says how close a kernel comes to moving data at all. A reduction streams
// three buffers to memcpy's two, so at DRAM sizes it cannot reach 1.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "src/common/datatype.h"
#include "src/common/reduce.h"

namespace {

using braid::DataType;
using braid::RedOp;

constexpr int64_t kMinBytes = int64_t{4} << 10;
constexpr int64_t kMaxBytes = int64_t{64} << 20;

// Fills with small values so sums and products stay finite in every type:
// the timings must not include slow paths for Inf or subnormals.
std::vector<uint8_t> makeOperand(DataType type, size_t count, int seed) {
  std::vector<uint8_t> bytes(count * braid::dataTypeSize(type));
  for (size_t i = 0; i < count; ++i) {
    const float value = static_cast<float>((i * 7 + static_cast<size_t>(seed)) % 13) * 0.25f;
    void* slot = bytes.data() + i * braid::dataTypeSize(type);
    switch (type) {
      case DataType::kFloat16:
        *static_cast<uint16_t*>(slot) = braid::floatToHalf(value);
        break;
      case DataType::kBfloat16:
        *static_cast<uint16_t*>(slot) = braid::floatToBfloat16(value);
        break;
      case DataType::kFloat32:
        *static_cast<float*>(slot) = value;
        break;
      case DataType::kFloat64:
        *static_cast<double*>(slot) = value;
        break;
      case DataType::kInt32:
        *static_cast<int32_t*>(slot) = static_cast<int32_t>(value * 4);
        break;
      default:
        break;  // zero bytes are a valid value of every other type
    }
  }
  return bytes;
}

void benchMemcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const std::vector<uint8_t> source = makeOperand(DataType::kFloat32, bytes / 4, 1);
  std::vector<uint8_t> destination(bytes);
  for (auto _ : state) {
    std::memcpy(destination.data(), source.data(), bytes);
    benchmark::DoNotOptimize(destination.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void benchReduce(benchmark::State& state, DataType type, RedOp op, bool inPlace) {
  const int64_t bytes = state.range(0);
  const size_t count = static_cast<size_t>(bytes) / braid::dataTypeSize(type);
  std::vector<uint8_t> a = makeOperand(type, count, 1);
  const std::vector<uint8_t> b = makeOperand(type, count, 2);
  std::vector<uint8_t> out(a.size());
  void* dst = inPlace ? a.data() : out.data();
  for (auto _ : state) {
    braid::reduceElements(dst, a.data(), b.data(), count, type, op);
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void sizes(benchmark::internal::Benchmark* bench) {
  bench->RangeMultiplier(16)->Range(kMinBytes, kMaxBytes);
}

}  // namespace

BENCHMARK(benchMemcpy)->Apply(sizes);
BENCHMARK_CAPTURE(benchReduce, float32_sum, DataType::kFloat32, RedOp::kSum, false)->Apply(sizes);
BENCHMARK_CAPTURE(benchReduce, bfloat16_sum, DataType::kBfloat16, RedOp::kSum, false)->Apply(sizes);
BENCHMARK_CAPTURE(benchReduce, float16_sum, DataType::kFloat16, RedOp::kSum, false)->Apply(sizes);
BENCHMARK_CAPTURE(benchReduce, int32_sum, DataType::kInt32, RedOp::kSum, false)->Apply(sizes);
BENCHMARK_CAPTURE(benchReduce, float64_max, DataType::kFloat64, RedOp::kMax, false)->Apply(sizes);
// dst == a, the accumulate-into-receive-buffer form: must not fall off the
// vector path because of the overlap check.
BENCHMARK_CAPTURE(benchReduce, float32_sum_inplace, DataType::kFloat32, RedOp::kSum, true)
    ->Apply(sizes);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("reduce_path", braid::reduce_internal::reduceIsaName(
                                                 braid::reduce_internal::reduceIsaSelected()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
