// The gradients on the wire, in memory of braidHostAlloc: the other ranks of
// a host copy and reduce them through a mapping of it, at memory speed,
// rather than through the kernel (docs/TRANSPORTS.md). As NCCL's users take
// the buffers of their collectives from ncclMemAlloc.
#ifndef BRAID_TOOLS_TRAINER_HOST_BUFFER_H_
#define BRAID_TOOLS_TRAINER_HOST_BUFFER_H_

#include <braid.h>

#include <cstddef>
#include <utility>

namespace trainer {

// Throws BraidError naming `what` when `result` is not braidSuccess
// (data_parallel.h).
void check(braidResult_t result, const char* what);

template <typename T>
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() {
    if (data_ != nullptr) (void)braidHostFree(data_);
  }

  // `count` zeroed elements, in place of what the buffer held.
  void resize(size_t count) {
    HostBuffer fresh;
    if (count > 0) {
      void* memory = nullptr;
      check(braidHostAlloc(&memory, count * sizeof(T)), "braidHostAlloc");
      fresh.data_ = static_cast<T*>(memory);
      fresh.size_ = count;
    }
    *this = std::move(fresh);
  }

  T* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace trainer

#endif  // BRAID_TOOLS_TRAINER_HOST_BUFFER_H_
