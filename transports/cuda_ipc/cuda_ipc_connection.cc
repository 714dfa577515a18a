#include "transports/cuda_ipc/cuda_ipc_connection.h"

#include <algorithm>
#include <cstring>

#include "src/common/strcat.h"

namespace braid::transport::cuda_ipc {
namespace {

constexpr uint64_t kHelloMagic = 0x6272616964495043;  // "braidIPC"
constexpr uint64_t kHelloTag = 0;
constexpr uint64_t kVerdictTag = 1;
constexpr uint64_t kVerdictMagic = 0x6970635f76657264;
constexpr uint64_t kRecordCheck = 0x6970635f72656364;
// Record receives kept posted ahead, so a burst of records is read in one
// progress() rather than one per call.
constexpr size_t kRecordsAhead = 8;

}  // namespace

namespace {

Status checkOptions(const CudaIpcConnection::Options& options) {
  if (options.slots < 1 || options.slots > CudaIpcConnection::kMaxSlots || options.slotBytes == 0 ||
      options.slotBytes % 16 != 0)
    return invalidArgument(strCat("cuda_ipc: ", options.slots, " slots of ", options.slotBytes,
                                  " bytes (1 to ", CudaIpcConnection::kMaxSlots,
                                  " slots, a multiple of 16 bytes)"));
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<CudaIpcConnection>> CudaIpcConnection::create(
    std::unique_ptr<Connection> control, std::shared_ptr<IpcDevice> device, Options options) {
  BRAID_RETURN_IF_ERROR(checkOptions(options));
  Connection& c = *control;
  std::unique_ptr<CudaIpcConnection> ipc(
      new CudaIpcConnection(c, std::move(control), 0, std::move(device), options));
  BRAID_RETURN_IF_ERROR(ipc->startHandshake());
  return ipc;
}

Result<std::unique_ptr<CudaIpcConnection>> CudaIpcConnection::createShared(
    Connection& control, uint8_t channel, std::shared_ptr<IpcDevice> device, Options options) {
  BRAID_RETURN_IF_ERROR(checkOptions(options));
  std::unique_ptr<CudaIpcConnection> ipc(
      new CudaIpcConnection(control, nullptr, channel, std::move(device), options));
  BRAID_RETURN_IF_ERROR(ipc->startHandshake());
  return ipc;
}

CudaIpcConnection::CudaIpcConnection(Connection& control, std::unique_ptr<Connection> owned,
                                     uint8_t channel, std::shared_ptr<IpcDevice> device,
                                     Options options)
    : ownedControl_(std::move(owned)),
      control_(&control),
      channelBits_(uint64_t{channel} << 56),
      device_(std::move(device)),
      options_(options) {}

CudaIpcConnection::~CudaIpcConnection() {
  // Queued copies may still read or write the slots: let them finish before
  // the memory and events go.
  (void)device_->synchronize();
}

Status CudaIpcConnection::startHandshake() {
  const auto slots = static_cast<size_t>(options_.slots);
  BRAID_ASSIGN_OR_RETURN(pool_, device_->allocate(slots * options_.slotBytes));
  hello_.magic = kHelloMagic;
  hello_.slots = static_cast<uint32_t>(slots);
  hello_.slotBytes = options_.slotBytes;
  hello_.pool = pool_->handle();
  for (size_t k = 0; k < slots; ++k) {
    BRAID_ASSIGN_OR_RETURN(auto filled, device_->createEvent());
    BRAID_ASSIGN_OR_RETURN(auto drained, device_->createEvent());
    hello_.filled[k] = filled->handle();
    hello_.drained[k] = drained->handle();
    filled_.push_back(std::move(filled));
    drained_.push_back(std::move(drained));
  }
  BRAID_RETURN_IF_ERROR(createDirectEvents());
  helloReceived_ = control_->postRecv(&peerHello_, sizeof(peerHello_),
                                      Tag{channelBits_ | kHelloTag, kHelloMagic});
  verdictReceived_ = control_->postRecv(&peerVerdict_, sizeof(peerVerdict_),
                                        Tag{channelBits_ | kVerdictTag, kVerdictMagic});
  helloSent_ =
      control_->postSend(&hello_, sizeof(hello_), Tag{channelBits_ | kHelloTag, kHelloMagic});
  return Status::ok();
}

Status CudaIpcConnection::finishHandshake() {
  const Hello& h = peerHello_;
  if (h.magic != kHelloMagic || h.slots < 1 || h.slots > kMaxSlots || h.slotBytes == 0 ||
      h.slotBytes % 16 != 0)
    return remoteError(strCat("cuda_ipc: rank ", peer(), " sent a malformed handshake"));
  const Status mapped = mapPeer();
  if (!mapped.isOk()) {
    // A peer that is gone is no reason to carry the pair another way.
    BRAID_RETURN_IF_ERROR(peerReasonOr(Status::ok()));
  }
  return sendVerdict(mapped);
}

Status CudaIpcConnection::mapPeer() {
  const Hello& h = peerHello_;
  BRAID_ASSIGN_OR_RETURN(peerPool_, device_->openMemory(h.pool));
  for (uint32_t k = 0; k < h.slots; ++k) {
    BRAID_ASSIGN_OR_RETURN(auto filled, device_->openEvent(h.filled[k]));
    BRAID_ASSIGN_OR_RETURN(auto drained, device_->openEvent(h.drained[k]));
    peerFilled_.push_back(std::move(filled));
    peerDrained_.push_back(std::move(drained));
  }
  return openDirectEvents();
}

Status CudaIpcConnection::sendVerdict(const Status& mapped) {
  verdict_.magic = kVerdictMagic;
  verdict_.mapped = mapped.isOk() ? 1 : 0;
  const std::string& why = mapped.message();
  const size_t length = std::min(why.size(), sizeof(verdict_.reason) - 1);
  std::memcpy(verdict_.reason, why.data(), length);
  verdict_.reason[length] = '\0';
  verdictSent_ = control_->postSend(&verdict_, sizeof(verdict_),
                                    Tag{channelBits_ | kVerdictTag, kVerdictMagic});
  return Status::ok();
}

Status CudaIpcConnection::settleMapping() {
  Verdict& theirs = peerVerdict_;
  if (theirs.magic != kVerdictMagic || theirs.mapped > 1)
    return remoteError(strCat("cuda_ipc: rank ", peer(), " sent a malformed verdict"));
  theirs.reason[sizeof(theirs.reason) - 1] = '\0';
  if (verdict_.mapped == 1 && theirs.mapped == 1) {
    for (uint32_t k = 0; k < peerHello_.slots; ++k) freePeerSlots_.push_back(k);
    peerSlotWritten_.assign(peerHello_.slots, false);
    for (uint32_t e = 0; e < kDirectReads; ++e) freeDirect_.push_back(e);
    ready_ = true;
    postRecordReceives();
    return Status::ok();
  }
  declined_ = verdict_.mapped == 0
                  ? notSupported(strCat("cuda_ipc: this rank cannot map the GPU memory of rank ",
                                        peer(), ": ", verdict_.reason))
                  : notSupported(strCat("cuda_ipc: rank ", peer(),
                                        " cannot map this rank's GPU memory: ", theirs.reason));
  // Declined is not broken: the host connection goes on carrying the rest.
  dead_ = declined_;
  for (auto& send : sends_) send.request->fail(declined_);
  sends_.clear();
  for (auto& [tag, p] : posted_) p.request->fail(declined_);
  posted_.clear();
  return Status::ok();
}

CudaIpcConnection::Mapping CudaIpcConnection::mapping() const {
  std::lock_guard lock(mutex_);
  return ready_ ? Mapping::kMapped : !declined_.isOk() ? Mapping::kDeclined : Mapping::kPending;
}

Status CudaIpcConnection::declinedBecause() const {
  std::lock_guard lock(mutex_);
  return declined_;
}

// Opening what the peer exported fails when the peer is gone (a file
// descriptor is fetched from its process); it said why before it went, and
// that reason is what this end reports.
Status CudaIpcConnection::peerReasonOr(Status mine) {
  for (int i = 0; i < 16; ++i) {
    auto moved = control_->progress();
    if (!moved.isOk() || !*moved) break;
  }
  Status theirs = control_->peerFailure();
  return theirs.isOk() ? mine : theirs;
}

uint8_t* CudaIpcConnection::slot(uint32_t k) const {
  return static_cast<uint8_t*>(pool_->data()) + k * options_.slotBytes;
}

uint8_t* CudaIpcConnection::peerSlot(uint32_t k) const {
  return static_cast<uint8_t*>(peerPool_->data()) + k * peerHello_.slotBytes;
}

void CudaIpcConnection::postRecordReceives() {
  while (recordsIn_.size() < kRecordsAhead) {
    recordsIn_.emplace_back();
    InRecord& in = recordsIn_.back();
    in.request = control_->postRecv(&in.record, sizeof(in.record),
                                    Tag{channelBits_ | nextRecordIn_++, kRecordCheck});
    // The control connection may be shared (createShared): another thread
    // may complete this while the caller sleeps.
    in.request->watch();
  }
}

Status CudaIpcConnection::sendRecord(const Record& record) {
  recordsOut_.push_back(OutRecord{record, nullptr});
  OutRecord& out = recordsOut_.back();
  out.request = control_->postSend(&out.record, sizeof(out.record),
                                   Tag{channelBits_ | nextRecordOut_++, kRecordCheck});
  out.request->watch();
  return Status::ok();
}

RequestPtr CudaIpcConnection::postSend(const void* data, size_t bytes, Tag tag) {
  auto request = std::make_shared<Request>();
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) {
    request->fail(dead_);
    return request;
  }
  sends_.push_back(PendingSend{static_cast<const uint8_t*>(data), bytes, tag, request});
  return request;
}

RequestPtr CudaIpcConnection::postRecv(void* data, size_t bytes, Tag tag) {
  return postRecvReduce(data, nullptr, bytes, tag, Combiner{});
}

RequestPtr CudaIpcConnection::postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                                             const Combiner& combiner) {
  auto request = std::make_shared<Request>();
  PostedRecv p{static_cast<uint8_t*>(dst),
               static_cast<const uint8_t*>(local),
               bytes,
               tag.check,
               combiner,
               request};
  std::lock_guard lock(mutex_);
  // A message that arrived whole before the peer left is still delivered
  // (the peer may leave right after its last send), unless the peer failed
  // or this end aborted.
  auto it = unexpected_.find(tag.value);
  if (!dead_.isOk() && (it == unexpected_.end() || !it->second.whole() || abortedHere_ ||
                        !control_->peerFailure().isOk())) {
    request->fail(dead_);
    return request;
  }
  if (it != unexpected_.end()) {
    bool done = false;
    if (Status s = matchUnexpected(tag.value, p, done); !s.isOk()) {
      failAll(s);
      // Not among the posted receives failAll fails.
      if (request->state() == Request::State::kPending) request->fail(dead_);
      return request;
    }
    if (!done && request->state() == Request::State::kPending) posted_.emplace(tag.value, p);
    return request;
  }
  if (const auto later = latestArrived_.after(tag.value)) {
    request->fail(invalidUsage(strCat("rank ", peer(), " moved past this message")),
                  Request::Failure::kOvertaken, Tag{*later, 0});
    return request;
  }
  posted_.emplace(tag.value, p);
  return request;
}

bool CudaIpcConnection::Unexpected::whole() const {
  uint64_t arrived = 0;
  for (const Chunk& c : chunks) arrived += c.length;
  return !chunks.empty() && arrived == total;
}

// A message held in slots (or spilled) meets its receive.
Status CudaIpcConnection::matchUnexpected(uint64_t tag, PostedRecv& p, bool& done) {
  auto it = unexpected_.find(tag);
  Unexpected u = std::move(it->second);
  unexpected_.erase(it);
  p.arriving = true;
  if (u.check != p.check || u.total != p.bytes) {
    failDifferentCall(p, tag, u.check, u.total);
    done = true;
    // Answered unread: the sender's request is done, as a send through the
    // slots would be.
    if (u.direct) return sendRecord(Record{kDirectDropped, u.direct->slot, tag, 0, 0, 0, 0, 0, {}});
    // Its slots go back to the sender unread; what is still to come of it
    // is dropped as it arrives.
    uint64_t arrived = 0;
    for (const Chunk& c : u.chunks) {
      arrived += c.length;
      if (c.spilledTo != nullptr) {
        freeSpillBlocks_.push_back(c.spilledTo);
      } else if (c.length > 0) {
        --heldSlots_;
        BRAID_RETURN_IF_ERROR(sendRecord(Record{kCredit, c.slot, 0, 0, 0, 0, 0}));
      }
    }
    if (arrived < u.total) dropping_[tag] = u.total - arrived;
    return Status::ok();
  }
  if (u.direct) {
    done = true;
    return readDirect(p, *u.direct);
  }
  for (const Chunk& c : u.chunks) {
    if (c.spilledTo == nullptr && c.length > 0) --heldSlots_;
    BRAID_RETURN_IF_ERROR(consume(p, c));
  }
  done = p.request->state() != Request::State::kPending;
  return Status::ok();
}

Status CudaIpcConnection::consume(PostedRecv& p, const Chunk& c) {
  if (c.length > 0) {
    const bool spilled = c.spilledTo != nullptr;
    const uint8_t* from = spilled ? c.spilledTo : slot(c.slot);
    if (!spilled) BRAID_RETURN_IF_ERROR(device_->enqueueWait(*peerFilled_[c.slot]));
    if (p.combiner.apply != nullptr || p.combiner.applyOnDevice != nullptr) {
      BRAID_RETURN_IF_ERROR(device_->enqueueCombine(p.dst + c.offset, p.local + c.offset, from,
                                                    c.length, p.combiner));
    } else {
      BRAID_RETURN_IF_ERROR(device_->enqueueCopy(p.dst + c.offset, from, c.length));
    }
    if (spilled) {
      freeSpillBlocks_.push_back(c.spilledTo);
    } else if (dead_.isOk()) {  // credits only for a peer still there
      BRAID_RETURN_IF_ERROR(device_->enqueueRecord(*drained_[c.slot]));
      BRAID_RETURN_IF_ERROR(sendRecord(Record{kCredit, c.slot, 0, 0, 0, 0, 0}));
    }
  }
  p.consumed += c.length;
  if (p.consumed == p.bytes) p.request->complete();
  return Status::ok();
}

void CudaIpcConnection::failDifferentCall(PostedRecv& p, uint64_t tag, uint64_t check,
                                          uint64_t total) {
  p.request->fail(invalidUsage(strCat("message from rank ", peer(), " does not match (", total,
                                      " bytes arrived, ", p.bytes, " expected)")),
                  Request::Failure::kDifferentCall, Tag{tag, check});
}

CudaIpcConnection::Unexpected& CudaIpcConnection::unexpectedOf(const Record& r) {
  Unexpected& u = unexpected_[r.tag];
  if (u.chunks.empty()) {
    u.check = r.check;
    u.total = r.total;
  }
  return u;
}

void CudaIpcConnection::failPostedBefore(uint64_t tag) {
  rangesBefore(tag, [&](uint64_t first, uint64_t last) {
    for (auto it = posted_.lower_bound(first); it != posted_.end() && it->first <= last;) {
      if (it->second.consumed > 0 || it->second.arriving) {  // its message is arriving
        ++it;
        continue;
      }
      it->second.request->fail(invalidUsage(strCat("rank ", peer(), " moved past this message")),
                               Request::Failure::kOvertaken, Tag{tag, 0});
      it = posted_.erase(it);
    }
  });
}

Status CudaIpcConnection::chunkArrived(const Record& r) {
  const Chunk c{r.offset, r.length, r.slot};
  if (r.length > 0 &&
      (r.slot >= static_cast<uint32_t>(options_.slots) || r.length > options_.slotBytes))
    return remoteError(strCat("cuda_ipc: rank ", peer(), " wrote outside its slots"));
  if (r.offset > r.total || r.length > r.total - r.offset)
    return remoteError(strCat("cuda_ipc: rank ", peer(), " sent a chunk past its message"));
  if (auto d = dropping_.find(r.tag); d != dropping_.end()) {
    if (r.length > 0) BRAID_RETURN_IF_ERROR(sendRecord(Record{kCredit, r.slot, 0, 0, 0, 0, 0}));
    if ((d->second -= r.length) == 0) dropping_.erase(d);
    return Status::ok();
  }
  if (r.offset == 0) {
    latestArrived_.arrived(r.tag);
    failPostedBefore(r.tag);
  }
  if (auto it = posted_.find(r.tag); it != posted_.end() && !unexpected_.count(r.tag)) {
    PostedRecv& p = it->second;
    if (p.check == r.check && p.bytes == r.total) {
      BRAID_RETURN_IF_ERROR(consume(p, c));
      if (p.request->state() != Request::State::kPending) posted_.erase(it);
      return Status::ok();
    }
    failDifferentCall(p, r.tag, r.check, r.total);
    posted_.erase(it);
  }
  unexpectedOf(r).chunks.push_back(c);
  if (r.length > 0 && ++heldSlots_ == static_cast<size_t>(options_.slots))
    BRAID_RETURN_IF_ERROR(spillHeldChunks());
  return Status::ok();
}

Status CudaIpcConnection::handleRecord(const Record& r) {
  if (r.kind == kCredit) {
    if (r.slot >= peerHello_.slots ||
        std::find(freePeerSlots_.begin(), freePeerSlots_.end(), r.slot) != freePeerSlots_.end())
      return remoteError(strCat("cuda_ipc: rank ", peer(), " returned a slot it did not hold"));
    freePeerSlots_.push_back(r.slot);
    return Status::ok();
  }
  if (r.kind == kChunk) return chunkArrived(r);
  if (r.kind == kDirect) return directArrived(r);
  if (r.kind == kForget) return forgetArrived(r);
  if (r.kind == kDirectRead || r.kind == kDirectDropped || r.kind == kDirectRefused ||
      r.kind == kDirectDeclined)
    return directAnswered(r);
  return remoteError(strCat("cuda_ipc: rank ", peer(), " sent a record of unknown kind ", r.kind));
}

Status CudaIpcConnection::pushSends(bool& moved) {
  while (!sends_.empty()) {
    PendingSend& s = sends_.front();
    bool sentDirect = false;
    BRAID_RETURN_IF_ERROR(trySendDirect(s, sentDirect));
    if (sentDirect) {
      sends_.pop_front();
      moved = true;
      continue;
    }
    if (s.bytes == 0) {
      BRAID_RETURN_IF_ERROR(sendRecord(Record{kChunk, 0, s.tag.value, s.tag.check, 0, 0, 0}));
    } else {
      while (s.queued < s.bytes && !freePeerSlots_.empty()) {
        const uint32_t k = freePeerSlots_.front();
        freePeerSlots_.pop_front();
        const size_t length = std::min<size_t>(peerHello_.slotBytes, s.bytes - s.queued);
        if (peerSlotWritten_[k]) BRAID_RETURN_IF_ERROR(device_->enqueueWait(*peerDrained_[k]));
        BRAID_RETURN_IF_ERROR(device_->enqueueCopy(peerSlot(k), s.data + s.queued, length));
        BRAID_RETURN_IF_ERROR(device_->enqueueRecord(*filled_[k]));
        peerSlotWritten_[k] = true;
        BRAID_RETURN_IF_ERROR(
            sendRecord(Record{kChunk, k, s.tag.value, s.tag.check, s.bytes, s.queued, length}));
        s.queued += length;
        moved = true;
      }
      if (s.queued < s.bytes) return Status::ok();  // waits for credits
    }
    // Done once its last record is written too (below): a rank that ends
    // right after its last send must not take unwritten records with it.
    sentAwaitingRecord_.push_back({s.request, recordsOut_.back().request});
    sends_.pop_front();
    moved = true;
  }
  return Status::ok();
}

Status CudaIpcConnection::completeWrittenSends(bool& moved) {
  while (!sentAwaitingRecord_.empty()) {
    auto& [send, record] = sentAwaitingRecord_.front();
    if (record->state() == Request::State::kPending) break;
    if (record->state() == Request::State::kFailed) return record->error();
    send->complete();
    sentAwaitingRecord_.pop_front();
    moved = true;
  }
  return Status::ok();
}

Result<bool> CudaIpcConnection::progress() {
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) {
    // The verdict that declined may still be on its way out.
    if (!declined_.isOk()) (void)control_->progress();
    return dead_;
  }
  // A host connection that just failed (the peer left) may still hold
  // records that arrived before: they are handled first, so what the peer
  // sent before it left is received.
  auto controlMoved = control_->progress();
  bool moved = controlMoved.isOk() && *controlMoved;
  Status status = Status::ok();
  if (!ready_) {
    if (helloSent_->state() == Request::State::kFailed)
      status = helloSent_->error();
    else if (helloReceived_->state() == Request::State::kFailed)
      status = helloReceived_->error();
    else if (verdictReceived_->state() == Request::State::kFailed)
      status = verdictReceived_->error();
    else if (verdictGiven() && verdictSent_->state() == Request::State::kFailed)
      status = verdictSent_->error();
    if (status.isOk() && !verdictGiven() && helloReceived_->state() == Request::State::kDone) {
      status = finishHandshake();
      if (!status.isOk()) status = peerReasonOr(status);
      moved = true;
    }
    if (status.isOk() && verdictGiven() && verdictReceived_->state() == Request::State::kDone) {
      status = settleMapping();
      moved = true;
      if (!declined_.isOk()) return declined_;
    }
  }
  while (status.isOk() && ready_ && !recordsIn_.empty() &&
         recordsIn_.front().request->state() != Request::State::kPending) {
    InRecord& in = recordsIn_.front();
    if (in.request->state() == Request::State::kFailed) {
      status = in.request->error();
      break;
    }
    status = handleRecord(in.record);
    recordsIn_.pop_front();
    postRecordReceives();
    moved = true;
  }
  if (status.isOk() && !controlMoved.isOk()) status = controlMoved.status();
  if (status.isOk() && ready_ && !namedHeld_.empty()) status = tellFreed();
  if (status.isOk() && !forgotten_.empty()) (void)mayMap([&] { (void)takeReadForgotten(); });
  if (status.isOk() && ready_) status = pushSends(moved);
  while (status.isOk() && !recordsOut_.empty() &&
         recordsOut_.front().request->state() != Request::State::kPending) {
    if (recordsOut_.front().request->state() == Request::State::kFailed)
      status = recordsOut_.front().request->error();
    recordsOut_.pop_front();
  }
  // Records just queued go out now rather than at the next call. That call
  // may also read the peer's last records and its goodbye: its failure is
  // left to the next progress(), which handles those records first; the
  // caller comes back, for something moved.
  if (status.isOk() && moved) (void)control_->progress();
  if (status.isOk()) status = completeWrittenSends(moved);
  if (!status.isOk()) {
    failAll(status);
    return dead_;
  }
  return moved;
}

void CudaIpcConnection::forgetArrivalsBefore(uint64_t tag) {
  std::lock_guard lock(mutex_);
  latestArrived_.forgetBefore(tag);
}

std::optional<Tag> CudaIpcConnection::unclaimed(uint8_t channel, uint64_t below) {
  std::lock_guard lock(mutex_);
  // A bound of another channel than `channel` would be the caller's mistake.
  if (channelOf(below) != channel) return std::nullopt;
  auto it = firstBefore(unexpected_, below);
  if (it == unexpected_.end()) return std::nullopt;
  return Tag{it->first, it->second.check};
}

bool CudaIpcConnection::mayHaveUnclaimed() const {
  {
    std::lock_guard lock(mutex_);
    if (!unexpected_.empty()) return true;
  }
  return control_->mayHaveUnclaimed();
}

size_t CudaIpcConnection::directReads() const {
  std::lock_guard lock(mutex_);
  return directReads_;
}

size_t CudaIpcConnection::spilledChunks() const {
  std::lock_guard lock(mutex_);
  return spilledChunks_;
}

void CudaIpcConnection::failAll(const Status& reason, uint64_t callMark) {
  if (dead_.isOk()) dead_ = reason;
  for (auto& s : sends_) s.request->fail(dead_);
  sends_.clear();
  // A send whose last record was written before the end is done: the peer
  // has all it needs (it may have read that record and then left).
  for (auto& [send, record] : sentAwaitingRecord_) {
    if (record->state() == Request::State::kDone)
      send->complete();
    else
      send->fail(dead_);
  }
  sentAwaitingRecord_.clear();
  failDirectSends();
  for (auto& [tag, p] : posted_) p.request->fail(dead_);
  posted_.clear();
  control_->abortInCall(reason, callMark);
}

void CudaIpcConnection::abortInCall(const Status& reason, uint64_t callMark) {
  std::lock_guard lock(mutex_);
  // A declined connection still ends the host connection under it: the
  // peer, which carries the pair another way, must learn of the abort.
  if (abortedHere_ || (!dead_.isOk() && declined_.isOk())) return;
  if (dead_.isOk()) dead_ = reason.isOk() ? remoteError("cuda_ipc: connection closed") : reason;
  abortedHere_ = true;
  failAll(reason, callMark);
}

}  // namespace braid::transport::cuda_ipc
