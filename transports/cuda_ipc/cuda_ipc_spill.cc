// Spilling: a message whose receive is not posted holds its slots, and
// once it holds all of them, its chunks are copied out into spill blocks of
// this end's GPU memory so the sender can go on (cuda_ipc_connection.h).
// And reserve(), which makes ahead, before a CUDA stream waits, what a call
// would otherwise make while it waits.
#include "transports/cuda_ipc/cuda_ipc_connection.h"

namespace braid::transport::cuda_ipc {

Status CudaIpcConnection::spillHeldChunks() {
  for (auto& [tag, u] : unexpected_) {
    for (Chunk& c : u.chunks) {
      if (c.spilledTo != nullptr || c.length == 0) continue;
      BRAID_ASSIGN_OR_RETURN(uint8_t * block, takeSpillBlock());
      BRAID_RETURN_IF_ERROR(device_->enqueueWait(*peerFilled_[c.slot]));
      BRAID_RETURN_IF_ERROR(device_->enqueueCopy(block, slot(c.slot), c.length));
      BRAID_RETURN_IF_ERROR(device_->enqueueRecord(*drained_[c.slot]));
      BRAID_RETURN_IF_ERROR(sendRecord(Record{kCredit, c.slot, 0, 0, 0, 0, 0}));
      c.spilledTo = block;
      --heldSlots_;
      ++spilledChunks_;
    }
  }
  return Status::ok();
}

size_t CudaIpcConnection::spillRoundBytes() const {
  return static_cast<size_t>(options_.slots) * options_.slotBytes;
}

void CudaIpcConnection::addSpillRound(std::unique_ptr<DeviceMemory> round) {
  auto* base = static_cast<uint8_t*>(round->data());
  // Taken from the back: the round's blocks in address order.
  for (int k = options_.slots - 1; k >= 0; --k)
    freeSpillBlocks_.push_back(base + static_cast<size_t>(k) * options_.slotBytes);
  spillRounds_.push_back(std::move(round));
}

Result<uint8_t*> CudaIpcConnection::takeSpillBlock() {
  if (freeSpillBlocks_.empty()) {
    BRAID_ASSIGN_OR_RETURN(auto round, device_->allocateUnshared(spillRoundBytes()));
    addSpillRound(std::move(round));
  }
  uint8_t* block = freeSpillBlocks_.back();
  freeSpillBlocks_.pop_back();
  return block;
}

// Any message may spill, a later call's too: the sizes do not matter.
Status CudaIpcConnection::reserve(std::span<const size_t>, std::span<const size_t>) {
  // Before a CUDA stream waits for the call: a safe time to open the
  // peer's allocations that could not be opened during a call.
  BRAID_RETURN_IF_ERROR(openPendingAllocations());
  closeForgotten();
  {
    std::lock_guard lock(mutex_);
    if (!spillRounds_.empty() || !dead_.isOk()) return Status::ok();  // dead: nothing spills
  }
  // Allocated outside the lock, which the call before, still running on
  // the engine's thread, may need: an allocation can wait for a lock of
  // the driver that an application thread holds until that call ends.
  BRAID_ASSIGN_OR_RETURN(auto round, device_->allocateUnshared(spillRoundBytes()));
  std::lock_guard lock(mutex_);
  addSpillRound(std::move(round));  // two racing reserves: both rounds serve
  return Status::ok();
}

}  // namespace braid::transport::cuda_ipc
