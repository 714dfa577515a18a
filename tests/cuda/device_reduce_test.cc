// The device kernels against the host reference (src/common/reduce.h), bit
// for bit, for every type and operator, on counts and pointer offsets that
// reach both the 16-byte pack path and the scalar one.
#include "src/cuda/device_reduce.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "src/common/datatype.h"
#include "src/common/reduce.h"

namespace braid::cuda {
namespace {

constexpr DataType kAllTypes[] = {
    DataType::kInt8,    DataType::kUint8,   DataType::kInt32,   DataType::kUint32,
    DataType::kInt64,   DataType::kUint64,  DataType::kFloat16, DataType::kBfloat16,
    DataType::kFloat32, DataType::kFloat64,
};
constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};
constexpr size_t kCounts[] = {0, 1, 7, 1000003};

// Random bytes: every encoding appears, NaNs, infinities and subnormals
// among them, and products overflow as often as not.
std::vector<unsigned char> randomBytes(size_t bytes, uint32_t seed) {
  std::mt19937 engine(seed);
  std::vector<unsigned char> data(bytes);
  for (auto& byte : data) byte = static_cast<unsigned char>(engine());
  return data;
}

template <typename T>
T elementAt(const unsigned char* data, size_t index) {
  T value;
  std::memcpy(&value, data + index * sizeof value, sizeof value);
  return value;
}

bool isNanAt(const unsigned char* data, size_t index, DataType type) {
  switch (type) {
    case DataType::kFloat16:
      return std::isnan(halfToFloat(elementAt<uint16_t>(data, index)));
    case DataType::kBfloat16:
      return std::isnan(bfloat16ToFloat(elementAt<uint16_t>(data, index)));
    case DataType::kFloat32:
      return std::isnan(elementAt<float>(data, index));
    case DataType::kFloat64:
      return std::isnan(elementAt<double>(data, index));
    default:
      return false;
  }
}

// The index of the first element that differs, or -1. Where a sum or product
// has two NaN operands, the host's result depends on the order in which its
// compiler put the operands (x86 returns the first), so any NaN is accepted.
long firstMismatch(const std::vector<unsigned char>& expected,
                   const std::vector<unsigned char>& got, const std::vector<unsigned char>& a,
                   const std::vector<unsigned char>& b, size_t count, DataType type, RedOp op) {
  if (expected == got) return -1;
  const size_t size = dataTypeSize(type);
  const bool arithmetic = op == RedOp::kSum || op == RedOp::kProd || op == RedOp::kAvg;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(expected.data() + i * size, got.data() + i * size, size) == 0) continue;
    if (arithmetic && isNanAt(a.data(), i, type) && isNanAt(b.data(), i, type) &&
        isNanAt(got.data(), i, type))
      continue;
    return static_cast<long>(i);
  }
  return -1;
}

std::string hexElement(const std::vector<unsigned char>& data, size_t index, DataType type) {
  const size_t size = dataTypeSize(type);
  std::string text = "0x";
  char digits[3];
  for (size_t byte = size; byte-- > 0;) {  // little-endian: most significant last
    std::snprintf(digits, sizeof digits, "%02x", data[index * size + byte]);
    text += digits;
  }
  return text;
}

// Device memory freed on scope exit, so a failed assertion leaks nothing.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&data_, bytes == 0 ? 1 : bytes), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* bytes() { return static_cast<unsigned char*>(data_); }

 private:
  void* data_ = nullptr;
};

// Element offsets of dst, a and b from 256-byte aligned allocations. An
// offset of one element breaks the 16-byte alignment the pack path needs
// for every type; aliasing is the in-place form collectives use.
struct Layout {
  const char* name;
  size_t dstOffset, aOffset, bOffset;
  bool dstIsA;
};
constexpr Layout kLayouts[] = {
    {"aligned", 0, 0, 0, false},
    {"all misaligned", 1, 1, 1, false},
    {"b misaligned", 0, 0, 1, false},
    {"in place", 0, 0, 0, true},
};

class DeviceReduceTest : public ::testing::TestWithParam<std::tuple<DataType, RedOp>> {};

TEST_P(DeviceReduceTest, MatchesHostBitForBit) {
  const auto [type, op] = GetParam();
  const size_t size = dataTypeSize(type);
  uint32_t seed = 1;
  for (const size_t count : kCounts) {
    for (const Layout& layout : kLayouts) {
      SCOPED_TRACE(std::string(layout.name) + ", count " + std::to_string(count));
      const size_t bytes = count * size;
      const auto a = randomBytes(bytes, seed++);
      const auto b = randomBytes(bytes, seed++);
      std::vector<unsigned char> expected(bytes);
      reduceElements(expected.data(), a.data(), b.data(), count, type, op);

      const size_t slack = size;  // room for a one-element offset
      DeviceBuffer aBuffer(bytes + slack), bBuffer(bytes + slack), dstBuffer(bytes + slack);
      unsigned char* deviceA = aBuffer.bytes() + layout.aOffset * size;
      unsigned char* deviceB = bBuffer.bytes() + layout.bOffset * size;
      unsigned char* deviceDst =
          layout.dstIsA ? deviceA : dstBuffer.bytes() + layout.dstOffset * size;
      ASSERT_EQ(cudaMemcpy(deviceA, a.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(deviceB, b.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);

      const Status status = reduceOnDevice(deviceDst, deviceA, deviceB, count, type, op, nullptr);
      ASSERT_TRUE(status.isOk()) << status.message();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

      std::vector<unsigned char> got(bytes);
      ASSERT_EQ(cudaMemcpy(got.data(), deviceDst, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      const long mismatch = firstMismatch(expected, got, a, b, count, type, op);
      ASSERT_EQ(mismatch, -1) << dataTypeName(type) << " " << redOpName(op) << " element "
                              << mismatch << ": a " << hexElement(a, mismatch, type) << ", b "
                              << hexElement(b, mismatch, type) << ", host "
                              << hexElement(expected, mismatch, type) << ", device "
                              << hexElement(got, mismatch, type);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, DeviceReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kAllOps)),
                         [](const auto& testParam) {
                           return std::string(dataTypeName(std::get<0>(testParam.param))) + "_" +
                                  std::string(redOpName(std::get<1>(testParam.param)));
                         });

class DeviceAverageTest : public ::testing::TestWithParam<DataType> {};

TEST_P(DeviceAverageTest, MatchesHostBitForBit) {
  const DataType type = GetParam();
  const size_t size = dataTypeSize(type);
  uint32_t seed = 1000;
  for (const int divisor : {1, 2, 3, 7, 200}) {
    for (const size_t count : kCounts) {
      for (const size_t offset : {size_t{0}, size_t{1}}) {
        SCOPED_TRACE("divisor " + std::to_string(divisor) + ", count " + std::to_string(count) +
                     ", offset " + std::to_string(offset));
        const size_t bytes = count * size;
        const auto input = randomBytes(bytes, seed++);
        std::vector<unsigned char> expected = input;
        applyAverage(expected.data(), count, type, divisor);

        DeviceBuffer buffer(bytes + size);
        unsigned char* data = buffer.bytes() + offset * size;
        ASSERT_EQ(cudaMemcpy(data, input.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
        const Status status = averageOnDevice(data, count, type, divisor, nullptr);
        ASSERT_TRUE(status.isOk()) << status.message();
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

        std::vector<unsigned char> got(bytes);
        ASSERT_EQ(cudaMemcpy(got.data(), data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        // One operand: no NaN ambiguity, so the comparison is exact throughout.
        const long mismatch = firstMismatch(expected, got, input, input, count, type, RedOp::kMax);
        ASSERT_EQ(mismatch, -1) << dataTypeName(type) << " element " << mismatch << ": input "
                                << hexElement(input, mismatch, type) << ", host "
                                << hexElement(expected, mismatch, type) << ", device "
                                << hexElement(got, mismatch, type);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DeviceAverageTest, ::testing::ValuesIn(kAllTypes),
                         [](const auto& testParam) {
                           return std::string(dataTypeName(testParam.param));
                         });

TEST(DeviceCopyTest, CopiesAndOrdersOnTheStream) {
  const size_t bytes = 1000003;
  const auto input = randomBytes(bytes, 7);
  DeviceBuffer src(bytes), dst(bytes);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src.bytes(), input.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  const Status status = copyOnDevice(dst.bytes() + 1, src.bytes() + 1, bytes - 1, stream);
  ASSERT_TRUE(status.isOk()) << status.message();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<unsigned char> got(bytes - 1);
  ASSERT_EQ(cudaMemcpy(got.data(), dst.bytes() + 1, bytes - 1, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), input.begin() + 1));
  cudaStreamDestroy(stream);
}

// Every kernel loads ahead of its first launch (four operators and the
// average's division for each type), and loading again is harmless: braid
// loads them whenever a GPU path or a CUDA stream's bridge is made.
TEST(DeviceKernelLoading, LoadsEveryKernelAheadOfItsFirstLaunch) {
  for (int round = 0; round < 2; ++round) {
    Result<int> loaded = loadKernels();
    ASSERT_TRUE(loaded.isOk()) << loaded.status().message();
    EXPECT_EQ(*loaded, kNumDataTypes * 5);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(DeviceReduceErrors, UnknownTypeOrOperatorIsAnInvalidArgument) {
  DeviceBuffer buffer(64);
  EXPECT_EQ(reduceOnDevice(buffer.bytes(), buffer.bytes(), buffer.bytes(), 4,
                           static_cast<DataType>(kNumDataTypes), RedOp::kSum, nullptr)
                .code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(reduceOnDevice(buffer.bytes(), buffer.bytes(), buffer.bytes(), 4, DataType::kFloat32,
                           static_cast<RedOp>(kNumRedOps), nullptr)
                .code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(averageOnDevice(buffer.bytes(), 4, DataType::kFloat32, 0, nullptr).code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace braid::cuda

// Runs the suite only where a GPU is usable. Exit status 77 is how meson
// (and automake) count a test as skipped rather than passed or failed.
int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device here (%s)\n",
                cudaGetErrorString(error != cudaSuccess ? error : cudaErrorNoDevice));
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
