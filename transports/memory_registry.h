// The buffers a user has declared with braidCommRegister: ranges of memory
// that stay allocated until braidCommDeregister, so that a transport may
// register them with a device once and use the registration for every
// message from or into them.
//
// Only declared memory is cached. A registration pins the pages it was
// made on; memory freed and allocated again at the same address has other
// pages, and a cached registration of the first would move the wrong
// bytes without an error. Seeing every munmap needs hooks into the
// allocator, which a library linked into a framework cannot rely on; the
// user's declaration is the one thing that tells a range is still the
// same memory.
//
// Thread-safe: users register from their threads while transports look up
// from the progress threads.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "src/common/status.h"

namespace braid::transport {

class MemoryRegistry {
 public:
  struct Range {
    // Unique in the process, never reused: a cache keyed by it cannot mistake
    // a later range, nor a registry another's handle.
    uint64_t id = 0;
    uintptr_t base = 0;
    size_t bytes = 0;
  };

  // Declares [base, base + bytes). Ranges may overlap; a lookup finds the
  // earliest-declared one that holds the whole span.
  Result<uint64_t> add(const void* base, size_t bytes);
  // Forgets a range declared by add(); an unknown id is an error.
  Status remove(uint64_t id);
  // The declared range holding all of [address, address + bytes), if any.
  std::optional<Range> find(const void* address, size_t bytes) const;
  // Whether `id` is still declared.
  bool holds(uint64_t id) const;
  // Grows on every remove(): a cache that saw the same value holds nothing
  // stale.
  uint64_t removals() const;
  size_t size() const;

 private:
  mutable std::mutex mutex_;
  std::map<uint64_t, Range> ranges_;  // by id, in order of declaration
  uint64_t removals_ = 0;
};

}  // namespace braid::transport
