#include "transports/ib/registration_cache.h"

namespace braid::ib {

void RegistrationCache::dropRemoved() {
  const uint64_t removals = registry_->removals();
  if (removals == removalsSeen_) return;
  removalsSeen_ = removals;
  for (auto it = regions_.begin(); it != regions_.end();)
    it = registry_->holds(it->first) ? std::next(it) : regions_.erase(it);
}

Result<const MemoryRegion*> RegistrationCache::find(const void* address, size_t bytes) {
  if (!registry_) return nullptr;
  dropRemoved();
  const auto range = registry_->find(address, bytes);
  if (!range) return nullptr;
  if (auto it = regions_.find(range->id); it != regions_.end()) return it->second.get();
  // Both directions: the peer reads from a send buffer, and this end reads
  // into a receive buffer.
  BRAID_ASSIGN_OR_RETURN(auto region,
                         pd_.registerMemory(reinterpret_cast<void*>(range->base), range->bytes,
                                            {.localWrite = true, .remoteRead = true}));
  ++made_;
  return (regions_[range->id] = std::move(region)).get();
}

}  // namespace braid::ib
