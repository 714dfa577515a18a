// Reads in place: a large message's receiver reads it out of the sender's
// own buffer, rather than out of a slot the sender copied it into
// (cuda_ipc_connection.h, "Reads in place").
#include <utility>

#include "src/common/log.h"
#include "src/common/strcat.h"
#include "transports/cuda_ipc/cuda_ipc_connection.h"

namespace braid::transport::cuda_ipc {

bool CudaIpcConnection::mayMap(const std::function<void()>& work) {
  if (!options_.ifMayMap) {
    work();
    return true;
  }
  return options_.ifMayMap(work);
}

Status CudaIpcConnection::createDirectEvents() {
  for (uint32_t e = 0; e < kDirectReads; ++e) {
    BRAID_ASSIGN_OR_RETURN(auto ready, device_->createEvent());
    BRAID_ASSIGN_OR_RETURN(auto read, device_->createEvent());
    hello_.ready[e] = ready->handle();
    hello_.read[e] = read->handle();
    sourceReady_.push_back(std::move(ready));
    sourceRead_.push_back(std::move(read));
  }
  return Status::ok();
}

Status CudaIpcConnection::openDirectEvents() {
  for (uint32_t e = 0; e < kDirectReads; ++e) {
    BRAID_ASSIGN_OR_RETURN(auto ready, device_->openEvent(peerHello_.ready[e]));
    BRAID_ASSIGN_OR_RETURN(auto read, device_->openEvent(peerHello_.read[e]));
    peerSourceReady_.push_back(std::move(ready));
    peerSourceRead_.push_back(std::move(read));
  }
  return Status::ok();
}

Status CudaIpcConnection::trySendDirect(PendingSend& s, bool& sent) {
  sent = false;
  if (s.viaSlots) return Status::ok();
  // Whether a message of `bytes` may be read in place when its buffer is
  // of the kind `minBytes` is for.
  auto largeEnough = [&](size_t minBytes) { return minBytes != 0 && s.bytes >= minBytes; };
  const bool anyBuffer = largeEnough(options_.directMinBytes);
  if (s.queued > 0 || s.bytes == 0 || !peerReadsInPlace_ ||
      !(anyBuffer || largeEnough(options_.heldDirectMinBytes))) {
    s.viaSlots = true;
    return Status::ok();
  }
  // Every read index taken (messages to a receiver that has not posted
  // their receives yet): through the slots, which never wait for it, rather
  // than wait for an index, which a schedule could need this message for.
  if (freeDirect_.empty()) {
    s.viaSlots = true;
    return Status::ok();
  }
  auto exported = device_->exportedRange(s.data, s.bytes);
  // Only where every buffer may be read in place is one exported now.
  if (!exported.isOk() && anyBuffer &&
      !mayMap([&] { exported = device_->exportRange(s.data, s.bytes); })) {
    s.viaSlots = true;  // not now: exported when a later call is prepared
    return Status::ok();
  }
  if (!exported.isOk()) {
    BRAID_TRACE("cuda_ipc: a ", s.bytes, "-byte message to rank ", peer(),
                " goes through the slots: ", exported.status().message());
    s.viaSlots = true;
    return Status::ok();
  }
  if (!anyBuffer && !(exported->peerHoldsMemory && largeEnough(options_.heldDirectMinBytes))) {
    s.viaSlots = true;
    return Status::ok();
  }
  const uint32_t e = freeDirect_.front();
  freeDirect_.pop_front();
  // Later work on this device may change the buffer only once the peer
  // read it: directAnswered queues that wait.
  BRAID_RETURN_IF_ERROR(device_->enqueueRecord(*sourceReady_[e]));
  BRAID_RETURN_IF_ERROR(
      sendRecord(Record{kDirect, e, s.tag.value, s.tag.check, s.bytes, exported->offset, s.bytes,
                        exported->allocationId, exported->handle}));
  if (exported->peerHoldsMemory) namedHeld_.insert(exported->allocationId);
  directSends_.emplace(e, std::move(s));
  sent = true;
  return Status::ok();
}

Status CudaIpcConnection::directAnswered(const Record& r) {
  auto it = directSends_.find(r.slot);
  if (it == directSends_.end() || it->second.tag.value != r.tag)
    return remoteError(
        strCat("cuda_ipc: rank ", peer(), " answered a direct message it was not sent"));
  PendingSend s = std::move(it->second);
  directSends_.erase(it);
  freeDirect_.push_back(r.slot);
  if (r.kind == kDirectRead) BRAID_RETURN_IF_ERROR(device_->enqueueWait(*peerSourceRead_[r.slot]));
  if (r.kind == kDirectRead || r.kind == kDirectDropped) {
    s.request->complete();
    return Status::ok();
  }
  // Refused: this message and every later one go through the slots;
  // declined: this one only. Its record arrived first, so the receiver
  // waits for its chunks.
  if (r.kind == kDirectRefused && peerReadsInPlace_) {
    BRAID_INFO("cuda_ipc: rank ", peer(),
               " cannot read this rank's buffers in place; messages to it go through the slots");
    peerReadsInPlace_ = false;
  }
  s.viaSlots = true;
  sends_.push_front(std::move(s));
  return Status::ok();
}

Result<const uint8_t*> CudaIpcConnection::peerAllocation(const Record& r) {
  auto it = peerAllocations_.find(r.allocationId);
  if (it == peerAllocations_.end()) {
    if (peerAllocations_.size() >= kMaxPeerAllocations)
      return notSupported(strCat("cuda_ipc: ", kMaxPeerAllocations, " allocations of rank ", peer(),
                                 " are open already"));
    BRAID_ASSIGN_OR_RETURN(auto opened, device_->openMemory(r.handle));
    it = peerAllocations_.emplace(r.allocationId, std::move(opened)).first;
    pendingOpens_.erase(r.allocationId);
  }
  return static_cast<const uint8_t*>(it->second->data()) + r.offset;
}

Status CudaIpcConnection::declineDirect(const Record& r, Kind kind) {
  BRAID_RETURN_IF_ERROR(sendRecord(Record{kind, r.slot, r.tag, 0, 0, 0, 0, 0, {}}));
  if (auto posted = posted_.find(r.tag); posted != posted_.end())
    posted->second.arriving = true;
  else
    unexpectedOf(r);
  return Status::ok();
}

Status CudaIpcConnection::openPendingAllocations() {
  // Opened outside mutex_, which the engine's thread may need meanwhile;
  // opening_ keeps it from opening, or queueing, the same ids.
  std::map<uint64_t, IpcHandle> pending;
  {
    std::lock_guard lock(mutex_);
    if (!dead_.isOk() || !opening_.empty()) return Status::ok();
    for (const auto& [id, handle] : pendingOpens_)
      if (!peerAllocations_.count(id)) pending.emplace(id, handle);
    pendingOpens_.clear();
    for (const auto& [id, handle] : pending) opening_.insert(id);
  }
  for (const auto& [id, handle] : pending) {
    auto opened = device_->openMemory(handle);
    std::lock_guard lock(mutex_);
    opening_.erase(id);
    const bool forgotten = forgottenWhileOpening_.erase(id) != 0;
    if (opened.isOk() && forgotten) {  // freed by its owner meanwhile: never read
      forgotten_.push_back({std::move(*opened), -1});
      continue;
    }
    if (!opened.isOk()) {
      // The peer freed it since (its descriptor is withdrawn then), which
      // braidMemAlloc's memory allows: that allocation alone is not read.
      if (opened.status().code() == ErrorCode::kRemoteError) {
        BRAID_TRACE("cuda_ipc: an allocation of rank ", peer(),
                    " is gone before it was opened: ", opened.status().message());
        continue;
      }
      BRAID_INFO(
          "cuda_ipc: this rank cannot read rank ", peer(),
          "'s buffers in place, so they come through the slots: ", opened.status().message());
      cannotOpen_ = opened.status();
      continue;
    }
    if (peerAllocations_.size() < kMaxPeerAllocations)
      peerAllocations_.emplace(id, std::move(*opened));
  }
  return Status::ok();
}

Status CudaIpcConnection::directArrived(const Record& r) {
  if (r.slot >= kDirectReads || r.total == 0 || r.length != r.total)
    return remoteError(strCat("cuda_ipc: rank ", peer(), " sent a malformed direct record"));
  latestArrived_.arrived(r.tag);
  failPostedBefore(r.tag);
  auto posted = posted_.find(r.tag);
  if (posted != posted_.end() &&
      (posted->second.check != r.check || posted->second.bytes != r.total)) {
    failDifferentCall(posted->second, r.tag, r.check, r.total);
    posted_.erase(posted);
    // Answered unread, so the sender's request ends as a send through the
    // slots would; kept as unclaimed, to name the sender's call.
    unexpectedOf(r);
    return sendRecord(Record{kDirectDropped, r.slot, r.tag, 0, 0, 0, 0, 0, {}});
  }
  if (!cannotOpen_.isOk()) return declineDirect(r, kDirectRefused);
  // As many of the peer's allocations open as this end keeps: one more
  // comes through the slots, and those open are still read in place.
  if (!peerAllocations_.count(r.allocationId) &&
      peerAllocations_.size() + opening_.size() >= kMaxPeerAllocations) {
    if (!toldAllocationsFull_)
      BRAID_INFO("cuda_ipc: ", kMaxPeerAllocations, " allocations of rank ", peer(),
                 " are open here; messages from others come through the slots");
    toldAllocationsFull_ = true;
    return declineDirect(r, kDirectDeclined);
  }
  // Opened as it arrives, so that a refusal reaches the sender at once;
  // or, where it may not be opened now, declined, and opened later.
  Result<const uint8_t*> opened = notSupported("not opened");
  if (peerAllocations_.count(r.allocationId)) {
    opened = peerAllocation(r);  // open already: no driver call
  } else if (opening_.count(r.allocationId) || !mayMap([&] { opened = peerAllocation(r); })) {
    if (!opening_.count(r.allocationId)) pendingOpens_.emplace(r.allocationId, r.handle);
    return declineDirect(r, kDirectDeclined);
  }
  if (!opened.isOk()) {
    BRAID_INFO("cuda_ipc: this rank cannot read rank ", peer(),
               "'s buffers in place, so they come through the slots: ", opened.status().message());
    cannotOpen_ = opened.status();
    return declineDirect(r, kDirectRefused);
  }
  if (const size_t bytes = peerAllocations_.at(r.allocationId)->bytes();
      bytes > 0 && (r.offset > bytes || r.total > bytes - r.offset))
    return remoteError(strCat("cuda_ipc: rank ", peer(), " named ", r.total, " bytes at offset ",
                              r.offset, " of an allocation of ", bytes));
  if (posted != posted_.end()) {
    BRAID_RETURN_IF_ERROR(readDirect(posted->second, r));
    posted_.erase(posted);
    return Status::ok();
  }
  unexpectedOf(r).direct = r;
  return Status::ok();
}

Status CudaIpcConnection::readDirect(PostedRecv& p, const Record& r) {
  BRAID_ASSIGN_OR_RETURN(const uint8_t* from, peerAllocation(r));
  BRAID_RETURN_IF_ERROR(device_->enqueueWait(*peerSourceReady_[r.slot]));
  if (p.combiner.apply != nullptr || p.combiner.applyOnDevice != nullptr) {
    BRAID_RETURN_IF_ERROR(device_->enqueueCombine(p.dst, p.local, from, r.total, p.combiner));
  } else {
    BRAID_RETURN_IF_ERROR(device_->enqueueCopy(p.dst, from, r.total));
  }
  BRAID_RETURN_IF_ERROR(device_->enqueueRecord(*sourceRead_[r.slot]));
  lastRead_[r.allocationId] = r.slot;
  if (dead_.isOk())
    BRAID_RETURN_IF_ERROR(sendRecord(Record{kDirectRead, r.slot, r.tag, 0, 0, 0, 0, 0, {}}));
  ++directReads_;
  p.consumed = p.bytes;
  p.request->complete();
  return Status::ok();
}

// Whether the peer read them before it went is unknown: they fail. The
// peer may have queued its read and answered in a record not handled yet,
// so later work here waits for its read event all the same: at worst for
// an older record.
void CudaIpcConnection::failDirectSends() {
  for (auto& [e, s] : directSends_) {
    if (e < peerSourceRead_.size()) (void)device_->enqueueWait(*peerSourceRead_[e]);
    s.request->fail(dead_);
  }
  directSends_.clear();
}

Status CudaIpcConnection::tellFreed() {
  std::vector<uint64_t> freed;
  heldFreedSeen_ = device_->heldFreedSince(heldFreedSeen_, namedHeld_, freed);
  for (const uint64_t id : freed)
    if (namedHeld_.erase(id) != 0)
      BRAID_RETURN_IF_ERROR(sendRecord(Record{kForget, 0, 0, 0, 0, 0, 0, id, {}}));
  return Status::ok();
}

Status CudaIpcConnection::forgetArrived(const Record& r) {
  pendingOpens_.erase(r.allocationId);
  if (opening_.count(r.allocationId) != 0) forgottenWhileOpening_.insert(r.allocationId);
  auto open = peerAllocations_.find(r.allocationId);
  if (open == peerAllocations_.end()) return Status::ok();  // never opened here
  int lastRead = -1;
  if (auto read = lastRead_.find(r.allocationId); read != lastRead_.end()) {
    lastRead = static_cast<int>(read->second);
    lastRead_.erase(read);
  }
  forgotten_.push_back({std::move(open->second), lastRead});
  peerAllocations_.erase(open);
  return Status::ok();
}

std::vector<std::unique_ptr<DeviceMemory>> CudaIpcConnection::takeReadForgotten() {
  std::vector<std::unique_ptr<DeviceMemory>> read;
  for (auto it = forgotten_.begin(); it != forgotten_.end();) {
    // A later record of the same event means this read ran too: the
    // device runs its work in order.
    bool done = it->lastRead < 0;
    if (!done) {
      auto run = device_->hasRun(*sourceRead_[it->lastRead]);
      done = run.isOk() && *run;
    }
    if (!done) {
      ++it;
      continue;
    }
    read.push_back(std::move(it->memory));
    it = forgotten_.erase(it);
  }
  return read;
}

void CudaIpcConnection::closeForgotten() {
  std::vector<std::unique_ptr<DeviceMemory>> closing;
  {
    std::lock_guard lock(mutex_);
    closing = takeReadForgotten();
  }
  // Unmapped outside mutex_, as allocations are opened (reserve()).
  closing.clear();
}

}  // namespace braid::transport::cuda_ipc
