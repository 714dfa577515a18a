#include "transports/memory_registry.h"

#include "src/common/strcat.h"

namespace braid::transport {

Result<uint64_t> MemoryRegistry::add(const void* base, size_t bytes) {
  if (base == nullptr) return invalidArgument("registering a null buffer");
  if (bytes == 0) return invalidArgument("registering a buffer of 0 bytes");
  const auto start = reinterpret_cast<uintptr_t>(base);
  if (bytes - 1 > UINTPTR_MAX - start)
    return invalidArgument(
        strCat("a buffer of ", bytes, " bytes at ", base, " runs past the end of memory"));
  static std::atomic<uint64_t> nextId{1};
  const uint64_t id = nextId.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  ranges_[id] = {id, start, bytes};
  return id;
}

Status MemoryRegistry::remove(uint64_t id) {
  std::lock_guard lock(mutex_);
  if (ranges_.erase(id) == 0)
    return invalidArgument(strCat("handle ", id,
                                  " is not a registered buffer of this communicator"
                                  " (deregistered already?)"));
  ++removals_;
  return Status::ok();
}

std::optional<MemoryRegistry::Range> MemoryRegistry::find(const void* address, size_t bytes) const {
  const auto start = reinterpret_cast<uintptr_t>(address);
  std::lock_guard lock(mutex_);
  for (const auto& [id, r] : ranges_)
    if (start >= r.base && start - r.base <= r.bytes && bytes <= r.bytes - (start - r.base))
      return r;
  return std::nullopt;
}

bool MemoryRegistry::holds(uint64_t id) const {
  std::lock_guard lock(mutex_);
  return ranges_.count(id) > 0;
}

uint64_t MemoryRegistry::removals() const {
  std::lock_guard lock(mutex_);
  return removals_;
}

size_t MemoryRegistry::size() const {
  std::lock_guard lock(mutex_);
  return ranges_.size();
}

}  // namespace braid::transport
