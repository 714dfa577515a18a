// Memory registrations of declared user buffers (transport::MemoryRegistry)
// on one protection domain, made on first use and kept until the range is
// deregistered: registering pins and maps every page, costing far more
// than moving a chunk, so a buffer used by every call of a training step
// is registered once, not per message.
//
// Used from the one thread that progresses its stream.
#pragma once

#include <map>
#include <memory>

#include "transports/ib/verbs.h"
#include "transports/memory_registry.h"

namespace braid::ib {

class RegistrationCache {
 public:
  RegistrationCache(ProtectionDomain& pd, std::shared_ptr<const transport::MemoryRegistry> registry)
      : pd_(pd), registry_(std::move(registry)) {}

  // The registration covering [address, address + bytes), made now if its
  // declared range has none yet; null when no declared range holds it.
  // Registrations of ranges deregistered since the last call are released
  // first.
  Result<const MemoryRegion*> find(const void* address, size_t bytes);

  // For tests: registrations held, and how many were ever made.
  size_t held() const { return regions_.size(); }
  uint64_t made() const { return made_; }

 private:
  void dropRemoved();

  ProtectionDomain& pd_;
  const std::shared_ptr<const transport::MemoryRegistry> registry_;
  std::map<uint64_t, std::unique_ptr<MemoryRegion>> regions_;  // by range id
  uint64_t removalsSeen_ = 0;
  uint64_t made_ = 0;
};

}  // namespace braid::ib
