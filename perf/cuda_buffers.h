// GPU buffers for the perf tests' --mem cuda, through the CUDA driver API
// that the process loads at run time (libcuda.so.1): the perf binaries build
// and run the same with or without CUDA, and on a machine without a GPU the
// tests stand a fake driver in its place (tests/unit/fake_libcuda.c).
#pragma once

#include <cstddef>
#include <memory>

namespace braid::perf {

class CudaDriver {
 public:
  // Loads the driver, picks GPU `rank` modulo the GPUs this process sees (one
  // process per GPU, as nccl-tests runs) and makes its primary context
  // current on this thread. Throws std::runtime_error saying what failed.
  explicit CudaDriver(int rank);
  ~CudaDriver();
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  // The GPU's ordinal among those this process sees.
  int ordinal() const { return ordinal_; }

  // Device memory, freed when the pointer goes: cuMemAlloc's, or with
  // `shared` braidMemAlloc's (-R 1), which ranks of a host read in place.
  struct Free {
    CudaDriver* driver;
    bool braidMemory;
    void operator()(std::byte* memory) const;
  };
  using Buffer = std::unique_ptr<std::byte, Free>;
  Buffer allocate(size_t bytes, bool shared = false);

  void toDevice(std::byte* device, const std::byte* host, size_t bytes);
  void toHost(std::byte* host, const std::byte* device, size_t bytes);

 private:
  struct Api;
  void check(int result, const char* call);

  void* library_ = nullptr;
  std::unique_ptr<Api> api_;
  int device_ = -1;
  int ordinal_ = -1;
  void* context_ = nullptr;
};

}  // namespace braid::perf
