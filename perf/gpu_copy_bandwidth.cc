// The GPU's device-to-device copy bandwidth, the yardstick of GPU AllReduce
// (docs/GPU.md, "Perf"): cudaMemcpy between two buffers of GPU 0, timed with
// CUDA events over many copies, counting the bytes read and the bytes
// written. An AllReduce among ranks that share one GPU reads and writes its
// buffer in HBM about four times per byte of busbw, so busbw's bound is this
// figure divided by 4.
//
//   gpu_copy_bandwidth [bytes] [copies]     (defaults: 1 GiB, 20)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace {

int check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return 0;
  std::fprintf(stderr, "gpu_copy_bandwidth: %s: %s\n", what, cudaGetErrorString(error));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : size_t{1} << 30;
  const int copies = argc > 2 ? std::atoi(argv[2]) : 20;
  if (bytes == 0 || copies <= 0) {
    std::fprintf(stderr, "usage: gpu_copy_bandwidth [bytes > 0] [copies > 0]\n");
    return 2;
  }
  void* a = nullptr;
  void* b = nullptr;
  cudaEvent_t start, stop;
  if (check(cudaMalloc(&a, bytes), "cudaMalloc") || check(cudaMalloc(&b, bytes), "cudaMalloc") ||
      check(cudaMemset(a, 1, bytes), "cudaMemset") || check(cudaEventCreate(&start), "event") ||
      check(cudaEventCreate(&stop), "event"))
    return 1;
  // Warm up: the first copies pay for page mapping and clocks rising.
  for (int i = 0; i < 3; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(start);
  for (int i = 0; i < copies; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(stop);
  if (check(cudaEventSynchronize(stop), "the copies")) return 1;
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  const double seconds = ms / 1e3 / copies;
  const double readWrite = 2.0 * static_cast<double>(bytes) / seconds / 1e9;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s\n", prop.name);
  std::printf("copy of %zu bytes: %.3f ms\n", bytes, seconds * 1e3);
  std::printf("copy bandwidth (read + write): %.1f GB/s\n", readWrite);
  std::printf("allreduce busbw bound (/4): %.1f GB/s\n", readWrite / 4);
  return 0;
}
