// Reduction kernels on device memory. Their arithmetic is that of the host
// kernels in src/common/reduce.cc, operation for operation, because a GPU
// does not on its own round or propagate NaNs the way the host CPU does:
//
// - Every fp operation is an explicit round-to-nearest intrinsic (__fadd_rn,
//   __fmul_rn, ...). nvcc contracts a multiply and an add into one fused
//   operation by default, which skips a rounding; the intrinsics are never
//   contracted. Denormals are kept (the build passes no -ftz/--use_fast_math).
// - fp16/bf16 go through fp32 with the host's own conversions, ported as they
//   are, rather than the hardware's: both round to nearest-even, but they
//   encode NaNs differently.
// - A GPU returns one canonical NaN from any fp operation that yields a NaN.
//   The host CPU returns the NaN operand, quieted (a's if both are NaN), and
//   its own default NaN for an invalid operation such as inf - inf (negative
//   on x86, positive on Arm). hostNanResult rebuilds that, with the default
//   NaN measured on the host once, so the sign and payload match too.
//
// The kernels are memory bound: a grid-stride loop over 16-byte packs when
// all three pointers allow it, then a scalar tail, and a grid just large
// enough to fill the GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

// nvcc's front end takes the assignment of a [[nodiscard]] class in
// status.h for a discarded result of its operator=; host compilers do not.
#pragma nv_diag_suppress 2810
#include "src/cuda/device_reduce.h"
#pragma nv_diag_default 2810

namespace braid::cuda {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
// 132 SMs (H100) hold 8 blocks of 256 threads each; beyond about that many
// blocks a grid-stride loop gains nothing but scheduling overhead.
constexpr size_t kMaxBlocks = 1024;
constexpr size_t kPackBytes = 16;

Status cudaFailure(const std::string& what, cudaError_t error) {
  return Status(ErrorCode::kUnhandledCudaError, what + ": " + cudaGetErrorString(error));
}

// A launch reports its configuration errors through the thread's last error.
// That slot may also hold an earlier, unrelated failure of this thread, which
// is then reported here: a late report beats a lost one.
Status launchStatus(const char* what) {
  const cudaError_t error = cudaGetLastError();
  return error == cudaSuccess ? Status::ok() : cudaFailure(what, error);
}

// ---- NaNs as the host CPU makes them ----

struct HostNans {
  uint32_t float32;
  uint64_t float64;
};

// The NaN this CPU produces for an invalid operation, measured rather than
// assumed. volatile keeps the compiler from folding inf - inf to its own
// choice of NaN at compile time.
HostNans hostDefaultNans() {
  static const HostNans nans = [] {
    volatile float infinity32 = INFINITY;
    volatile double infinity64 = INFINITY;
    const float invalid32 = infinity32 - infinity32;
    const double invalid64 = infinity64 - infinity64;
    HostNans measured{};
    std::memcpy(&measured.float32, &invalid32, sizeof invalid32);
    std::memcpy(&measured.float64, &invalid64, sizeof invalid64);
    return measured;
  }();
  return nans;
}

__device__ __forceinline__ float quietNan(float x) {
  return __uint_as_float(__float_as_uint(x) | 0x00400000u);
}
__device__ __forceinline__ double quietNan(double x) {
  return __longlong_as_double(__double_as_longlong(x) | 0x0008000000000000ll);
}
__device__ __forceinline__ float defaultNan(float, const HostNans& nans) {
  return __uint_as_float(nans.float32);
}
__device__ __forceinline__ double defaultNan(double, const HostNans& nans) {
  return __longlong_as_double(static_cast<long long>(nans.float64));
}

// result is the GPU's a op b; a NaN in it is replaced by the host's NaN.
template <typename F>
__device__ __forceinline__ F hostNanResult(F a, F b, F result, const HostNans& nans) {
  if (!isnan(result)) return result;
  if (isnan(a)) return quietNan(a);
  if (isnan(b)) return quietNan(b);
  return defaultNan(result, nans);
}

// ---- fp16 and bf16, converted exactly as src/common/reduce.cc does ----

struct HalfFormat {
  __device__ __forceinline__ static float widen(uint16_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t magnitude = h & 0x7FFFu;
    const float normal = __fmul_rn(__uint_as_float((magnitude << 13) + (0xE0u << 23)), 0x1p-112f);
    const float subnormal = __fadd_rn(__uint_as_float(magnitude | (126u << 23)), -0.5f);
    const uint32_t bits =
        magnitude < 0x0400u ? __float_as_uint(subnormal) : __float_as_uint(normal);
    return __uint_as_float(sign | bits);
  }

  __device__ __forceinline__ static uint16_t narrow(float f) {
    const uint32_t bits = __float_as_uint(f);
    const uint32_t absBits = bits & 0x7FFFFFFFu;
    const float scaled = __fmul_rn(__fmul_rn(__uint_as_float(absBits), 0x1p112f), 0x1p-110f);
    const float exponentScaled = __fmul_rn(__uint_as_float(absBits & 0x7F800000u), 0x1p15f);
    const float bias = exponentScaled < 0x1p1f ? 0x1p1f : exponentScaled;
    const uint32_t rounded = __float_as_uint(__fadd_rn(bias, scaled));
    const uint32_t exponentBits = (rounded >> 13) & 0x7C00u;
    const uint32_t mantissaBits = rounded & 0x0FFFu;
    const bool isNan = absBits > 0x7F800000u;
    const uint32_t result = isNan ? 0x7E00u : exponentBits + mantissaBits;
    return static_cast<uint16_t>(((bits >> 16) & 0x8000u) | result);
  }
};

struct Bfloat16Format {
  __device__ __forceinline__ static float widen(uint16_t b) {
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
  }

  __device__ __forceinline__ static uint16_t narrow(float f) {
    const uint32_t bits = __float_as_uint(f);
    const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
    const bool isNan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    return static_cast<uint16_t>(isNan ? (bits >> 16) | 0x0040u : rounded >> 16);
  }
};

// ---- Element operations ----

__device__ __forceinline__ float add(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double add(double a, double b) {
  return __dadd_rn(a, b);
}
__device__ __forceinline__ float multiply(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double multiply(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ float divide(float a, float b) {
  return __fdiv_rn(a, b);
}
__device__ __forceinline__ double divide(double a, double b) {
  return __ddiv_rn(a, b);
}

template <typename T, RedOp kOp>
struct NativeCombine {
  HostNans nans;

  __device__ __forceinline__ T operator()(T a, T b) const {
    if constexpr (kOp == RedOp::kMax || kOp == RedOp::kMin) {
      // Selects as the host's combine does (reduce_portable.h), NaN on
      // either side kept: not fmaxf/fminf, which drop a NaN.
      const T selected = (kOp == RedOp::kMax ? a < b : b < a) ? b : a;
      if constexpr (std::is_floating_point_v<T>) return b != b ? b : selected;
      return selected;
    } else if constexpr (std::is_integral_v<T>) {
      // Wraps: unsigned arithmetic of at least int width, as on the host.
      using Wide = std::common_type_t<std::make_unsigned_t<T>, unsigned>;
      const Wide x = static_cast<Wide>(a), y = static_cast<Wide>(b);
      return static_cast<T>(kOp == RedOp::kSum ? x + y : x * y);
    } else {
      static_assert(kOp == RedOp::kSum || kOp == RedOp::kProd);
      return hostNanResult(a, b, kOp == RedOp::kSum ? add(a, b) : multiply(a, b), nans);
    }
  }
};

template <typename Format, RedOp kOp>
struct NarrowCombine {
  HostNans nans;

  __device__ __forceinline__ uint16_t operator()(uint16_t a, uint16_t b) const {
    return Format::narrow(NativeCombine<float, kOp>{nans}(Format::widen(a), Format::widen(b)));
  }
};

template <typename T>
struct NativeDivide {
  int divisor;
  HostNans nans;

  __device__ __forceinline__ T operator()(T value) const {
    if constexpr (std::is_integral_v<T> && sizeof(T) <= 4) {
      // The host divides these in double and truncates; so do we.
      return static_cast<T>(divide(static_cast<double>(value), static_cast<double>(divisor)));
    } else if constexpr (std::is_integral_v<T>) {
      return value / static_cast<T>(divisor);
    } else {
      const T d = static_cast<T>(divisor);
      return hostNanResult(value, d, divide(value, d), nans);
    }
  }
};

template <typename Format>
struct NarrowDivide {
  int divisor;
  HostNans nans;

  __device__ __forceinline__ uint16_t operator()(uint16_t value) const {
    return Format::narrow(NativeDivide<float>{divisor, nans}(Format::widen(value)));
  }
};

// ---- Kernels ----

template <typename T>
struct alignas(kPackBytes) Pack {
  static constexpr int kLanes = kPackBytes / sizeof(T);
  T lane[kLanes];
};

// Each element is read before it is written at the same index, so dst may
// be a or b; hence also no read-only (__ldg) loads.
template <typename T, typename Combine>
__global__ void __launch_bounds__(kThreadsPerBlock)
    combineKernel(T* dst, const T* a, const T* b, size_t count, bool packed, Combine combine) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t tailBegin = 0;
  if (packed) {
    using P = Pack<T>;
    const size_t packs = count / P::kLanes;
    for (size_t i = first; i < packs; i += stride) {
      const P x = reinterpret_cast<const P*>(a)[i];
      const P y = reinterpret_cast<const P*>(b)[i];
      P out;
#pragma unroll
      for (int lane = 0; lane < P::kLanes; ++lane)
        out.lane[lane] = combine(x.lane[lane], y.lane[lane]);
      reinterpret_cast<P*>(dst)[i] = out;
    }
    tailBegin = packs * P::kLanes;
  }
  for (size_t i = tailBegin + first; i < count; i += stride) dst[i] = combine(a[i], b[i]);
}

template <typename T, typename Transform>
__global__ void __launch_bounds__(kThreadsPerBlock)
    transformKernel(T* data, size_t count, bool packed, Transform transform) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t tailBegin = 0;
  if (packed) {
    using P = Pack<T>;
    const size_t packs = count / P::kLanes;
    for (size_t i = first; i < packs; i += stride) {
      P values = reinterpret_cast<const P*>(data)[i];
#pragma unroll
      for (int lane = 0; lane < P::kLanes; ++lane) values.lane[lane] = transform(values.lane[lane]);
      reinterpret_cast<P*>(data)[i] = values;
    }
    tailBegin = packs * P::kLanes;
  }
  for (size_t i = tailBegin + first; i < count; i += stride) data[i] = transform(data[i]);
}

// ---- Launches ----

bool packAligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kPackBytes == 0;
}

// One thread per pack (or element), up to the cap; the rest loop.
template <typename T>
unsigned blocksFor(size_t count, bool packed) {
  const size_t lanes = packed ? Pack<T>::kLanes : 1;
  const size_t workItems = count / lanes + count % lanes;
  const size_t wanted = (workItems + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned>(std::min(wanted, kMaxBlocks));
}

template <typename T, typename Combine>
Status launchCombine(void* dst, const void* a, const void* b, size_t count, Combine combine,
                     cudaStream_t stream) {
  const bool packed = packAligned(dst) && packAligned(a) && packAligned(b);
  combineKernel<<<blocksFor<T>(count, packed), kThreadsPerBlock, 0, stream>>>(
      static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count, packed,
      combine);
  return launchStatus("reduceOnDevice: kernel launch");
}

template <typename T, typename Transform>
Status launchTransform(void* data, size_t count, Transform transform, cudaStream_t stream) {
  const bool packed = packAligned(data);
  transformKernel<<<blocksFor<T>(count, packed), kThreadsPerBlock, 0, stream>>>(
      static_cast<T*>(data), count, packed, transform);
  return launchStatus("averageOnDevice: kernel launch");
}

// ---- Element types ----

// What a DataType is to the kernels: the type its elements are stored as,
// and the functors that combine and divide them.
template <typename T>
struct NativeElement {
  using Storage = T;
  template <RedOp kOp>
  using Combine = NativeCombine<T, kOp>;
  using Divide = NativeDivide<T>;
};

// fp16/bf16: stored as their bits, computed in fp32.
template <typename Format>
struct NarrowElement {
  using Storage = uint16_t;
  template <RedOp kOp>
  using Combine = NarrowCombine<Format, kOp>;
  using Divide = NarrowDivide<Format>;
};

bool knownDataType(DataType type) {
  return static_cast<int>(type) < kNumDataTypes;
}

Status unknownDataType(const char* caller, DataType type) {
  return invalidArgument(std::string(caller) + ": unknown data type " +
                         std::to_string(static_cast<int>(type)));
}

// The one switch over DataType: returns f(element), element being the
// type's NativeElement or NarrowElement, so that each entry point states
// only what it does with the type.
template <typename F>
Status withElementType(DataType type, const char* caller, F&& f) {
  switch (type) {
    case DataType::kInt8:
      return f(NativeElement<int8_t>{});
    case DataType::kUint8:
      return f(NativeElement<uint8_t>{});
    case DataType::kInt32:
      return f(NativeElement<int32_t>{});
    case DataType::kUint32:
      return f(NativeElement<uint32_t>{});
    case DataType::kInt64:
      return f(NativeElement<int64_t>{});
    case DataType::kUint64:
      return f(NativeElement<uint64_t>{});
    case DataType::kFloat16:
      return f(NarrowElement<HalfFormat>{});
    case DataType::kBfloat16:
      return f(NarrowElement<Bfloat16Format>{});
    case DataType::kFloat32:
      return f(NativeElement<float>{});
    case DataType::kFloat64:
      return f(NativeElement<double>{});
  }
  return unknownDataType(caller, type);
}

template <RedOp kOp>
Status reduceWithOp(void* dst, const void* a, const void* b, size_t count, DataType type,
                    cudaStream_t stream) {
  const HostNans nans = hostDefaultNans();
  return withElementType(type, "reduceOnDevice", [&](auto element) {
    using Element = decltype(element);
    return launchCombine<typename Element::Storage>(
        dst, a, b, count, typename Element::template Combine<kOp>{nans}, stream);
  });
}

template <typename T, typename Combine>
cudaError_t loadCombineKernel(Combine) {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, combineKernel<T, Combine>);
}

template <typename T, typename Transform>
cudaError_t loadTransformKernel(Transform) {
  cudaFuncAttributes attributes{};
  return cudaFuncGetAttributes(&attributes, transformKernel<T, Transform>);
}

// The kernels of one element type: one per reduction operator (kAvg
// reduces as kSum), and the division of kAvg.
template <typename Element>
Status loadKernelsOf(DataType type, int& loaded) {
  using T = typename Element::Storage;
  const cudaError_t errors[] = {
      loadCombineKernel<T>(typename Element::template Combine<RedOp::kSum>{}),
      loadCombineKernel<T>(typename Element::template Combine<RedOp::kProd>{}),
      loadCombineKernel<T>(typename Element::template Combine<RedOp::kMax>{}),
      loadCombineKernel<T>(typename Element::template Combine<RedOp::kMin>{}),
      loadTransformKernel<T>(typename Element::Divide{}),
  };
  cudaError_t firstError = cudaSuccess;
  for (const cudaError_t error : errors) {
    if (error == cudaSuccess) {
      ++loaded;
    } else if (firstError == cudaSuccess) {
      firstError = error;
      (void)cudaGetLastError();  // not left for the next launch to report
    }
  }
  if (firstError == cudaSuccess) return Status::ok();
  return cudaFailure("loading the reduction kernels of " + std::string(dataTypeName(type)),
                     firstError);
}

}  // namespace

Result<int> loadKernels() {
  int loaded = 0;
  Status firstFailure = Status::ok();
  // On past a type that fails: the others still load now, not at launch.
  for (int t = 0; t < kNumDataTypes; ++t) {
    const auto type = static_cast<DataType>(t);
    const Status status = withElementType(type, "loadKernels", [&](auto element) {
      return loadKernelsOf<decltype(element)>(type, loaded);
    });
    if (firstFailure.isOk() && !status.isOk()) firstFailure = status;
  }
  if (!firstFailure.isOk()) return firstFailure;
  return loaded;
}

Status reduceOnDevice(void* dst, const void* a, const void* b, size_t count, DataType type,
                      RedOp op, void* stream) {
  if (!knownDataType(type)) return unknownDataType("reduceOnDevice", type);
  if (count == 0) return Status::ok();
  const cudaStream_t cudaStream = static_cast<cudaStream_t>(stream);
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      return reduceWithOp<RedOp::kSum>(dst, a, b, count, type, cudaStream);
    case RedOp::kProd:
      return reduceWithOp<RedOp::kProd>(dst, a, b, count, type, cudaStream);
    case RedOp::kMax:
      return reduceWithOp<RedOp::kMax>(dst, a, b, count, type, cudaStream);
    case RedOp::kMin:
      return reduceWithOp<RedOp::kMin>(dst, a, b, count, type, cudaStream);
  }
  return invalidArgument("reduceOnDevice: unknown reduction operator " +
                         std::to_string(static_cast<int>(op)));
}

Status averageOnDevice(void* data, size_t count, DataType type, int divisor, void* stream) {
  if (!knownDataType(type)) return unknownDataType("averageOnDevice", type);
  if (divisor < 1)
    return invalidArgument("averageOnDevice: divisor " + std::to_string(divisor) +
                           " is not a rank count");
  if (divisor == 1 || count == 0) return Status::ok();
  const HostNans nans = hostDefaultNans();
  return withElementType(type, "averageOnDevice", [&](auto element) {
    using Element = decltype(element);
    return launchTransform<typename Element::Storage>(
        data, count, typename Element::Divide{divisor, nans}, static_cast<cudaStream_t>(stream));
  });
}

Status copyOnDevice(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0 || dst == src) return Status::ok();
  const cudaError_t error =
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream));
  return error == cudaSuccess ? Status::ok() : cudaFailure("copyOnDevice: cudaMemcpyAsync", error);
}

}  // namespace braid::cuda
