// A Connection between two processes of one host whose buffers live on
// GPUs: the payload moves from GPU to GPU through CUDA IPC, never through
// host memory; a host connection (shm or tcp, `control`) carries only small
// records that say what moved where.
//
// Each end owns a pool of `slots` receive slots of `slotBytes` in its GPU
// memory, exported to the peer, and two sets of interprocess events. A send
// is cut into slot-sized chunks; for each, the sender queues on its device:
//
//   wait(peer drained[k])   -- only if slot k was written before
//   copy  chunk -> peer slot k
//   record(filled[k])
//
// and sends the record {tag, check, total, offset, length, k}. The receiver,
// once a receive matches, queues on its device:
//
//   wait(peer filled[k]); copy (or combine) slot k -> place; record(drained[k])
//
// and sends back a credit for k. No host thread ever waits for the GPU, and
// no kernel spins on another process's progress: the waits are stream waits
// on events, so processes that share one GPU without MPS take turns freely.
//
// Completion. A request is done once every copy it needs is queued on the
// device's stream (and, for a send, its last record is written to the host
// connection), not once the copies ran: work queued later on the same
// device (IpcDevice) sees the data, and a caller that reads the buffer from
// the host must first synchronize the device. A send's buffer must not be
// changed other than by work queued later on that device.
//
// Mapping. After the hello each end opens what the peer exported and tells
// it whether that worked (the verdict). Only when both did does anything
// move; when either could not (GPUs without peer access, processes that may
// not share memory), the connection is declined: it moves nothing, and
// mapping() and declinedBecause() say so, on both ends alike, so that a
// caller can carry the pair's messages another way (IpcOrFallback).
//
// Reads in place. A message of at least Options::directMinBytes whose
// buffer the device can export (IpcDevice::exportRange: memory from
// cuMemAlloc, as cudaMalloc and PyTorch's allocator make) skips the slots:
// the sender queues record(ready[e]) and sends a direct record naming the
// buffer's allocation; the receiver opens it (once per allocation, kept
// open for the connection's life) and queues
//
//   wait(peer ready[e]); copy (or combine) peer buffer -> place; record(read[e])
//
// and answers with a read record for e, on which the sender queues
// wait(peer read[e]) and completes the send. So the bytes cross once, by
// the receiver's kernel or copy engine, rather than into a slot and out
// again, and a message costs one handoff each way whatever its size. A
// send is then done only once its receive is posted (a rendezvous): every
// algorithm's schedule completes so (tests/unit/rendezvous_test.cc). A
// receiver that cannot open the allocation answers so instead, and the
// sender moves that message, and every later one, through the slots.
// Opening takes the driver's memory lock, which nothing may take while a
// CUDA stream waits for a call (docs/GPU.md): where Options::ifMayMap says
// not now, the receiver declines that message alone, which then goes
// through the slots, and opens the allocation at the next reserve(), which
// runs before a CUDA stream waits; later messages from it are read in place.
// Exporting is held alike: a buffer not exported before goes through the
// slots then, and is exported when the next call is prepared
// (IpcDevice::exportRange, by the communicator). A buffer whose peer's
// mapping keeps its memory alive (braidMemAlloc's, shared_gpu_memory.h) is
// exported already, and has a minimum of its own,
// Options::heldDirectMinBytes: reading it in place asks nothing of when the
// caller frees it.
//
// A message that arrives before its receive holds its slots. When every
// slot of this end is held so, the held chunks are copied out into spill
// blocks, GPU memory of this end of a slot each, so the sender can go on
// and ranks that receive out of order still complete. A spill takes as
// much memory as the chunks it holds, never a whole message's worth.
#pragma once

#include <array>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "transports/channel_order.h"
#include "transports/cuda_ipc/ipc_device.h"
#include "transports/transport.h"

namespace braid::transport::cuda_ipc {

class CudaIpcConnection final : public Connection {
 public:
  static constexpr int kMaxSlots = 16;
  // Direct messages in flight at once, per direction; more go through the
  // slots.
  static constexpr uint32_t kDirectReads = 32;
  // Peer allocations one end keeps open; past them, messages use the slots.
  static constexpr size_t kMaxPeerAllocations = 256;
  struct Options {
    int slots = 8;
    size_t slotBytes = size_t{1} << 20;  // a multiple of 16, so no element spans two chunks
    // Messages of at least this many bytes are read in place (above); 0: none.
    size_t directMinBytes = 0;
    // The same for buffers whose peer's mapping keeps their memory alive
    // (ExportedRange::peerHoldsMemory: braidMemAlloc's); 0: none.
    size_t heldDirectMinBytes = 0;
    // Runs `work` (opening a peer's allocation, or exporting one of this
    // process) and returns true, unless such driver calls may not be made
    // now (above), atomically with respect to that changing; null: always.
    std::function<bool(const std::function<void()>& work)> ifMayMap;
  };

  // Allocates and exports this end's slots and events; the handshake with
  // the peer happens in progress(). `control` is used by this connection
  // only; `device` is shared by the connections of this rank.
  static Result<std::unique_ptr<CudaIpcConnection>> create(std::unique_ptr<Connection> control,
                                                           std::shared_ptr<IpcDevice> device,
                                                           Options options);
  // The same over a connection that also carries other messages (the host
  // connection to the same peer): the records use only tag channel
  // `channel`, which nothing else may use. `control` must outlive this.
  static Result<std::unique_ptr<CudaIpcConnection>> createShared(Connection& control,
                                                                 uint8_t channel,
                                                                 std::shared_ptr<IpcDevice> device,
                                                                 Options options);
  ~CudaIpcConnection() override;

  RequestPtr postSend(const void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecv(void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                            const Combiner& combiner) override;
  Result<bool> progress() override;
  int pollFd() const override { return control_->pollFd(); }
  bool wantsWrite() const override { return control_->wantsWrite(); }
  bool prepareToSleep() override { return control_->prepareToSleep(); }
  std::chrono::microseconds sleepAtMost() const override { return control_->sleepAtMost(); }
  void abort(const Status& reason) override { abortInCall(reason, 0); }
  void abortInCall(const Status& reason, uint64_t callMark) override;
  Status peerFailure() const override { return control_->peerFailure(); }
  bool ended() const override { return control_->ended(); }
  uint64_t peerFailedCall() const override { return control_->peerFailedCall(); }
  std::optional<Tag> unclaimed(uint8_t channel, uint64_t below) override;
  void forgetArrivalsBefore(uint64_t tag) override;
  bool mayHaveUnclaimed() const override;
  int peer() const override { return control_->peer(); }

  // Allocates one round of spill blocks (a block for every slot: a round
  // spills at most every slot) unless the connection has blocks already,
  // so that a call on a CUDA stream spills without allocating while the
  // stream waits for it. Rounds beyond the first held at once are still
  // allocated as they come.
  Status reserve(std::span<const size_t> sends, std::span<const size_t> recvs) override;

  // Chunks copied out of held slots so far (see above): for tests.
  size_t spilledChunks() const;

  // Whether the two ends mapped each other's memory (see above): kPending
  // until both verdicts are known.
  enum class Mapping { kPending, kMapped, kDeclined };
  Mapping mapping() const;
  // Why, once mapping() is kDeclined: which end could not map what, and the
  // driver's error.
  Status declinedBecause() const;

  // Messages read in place so far, by this end's receives: for tests.
  size_t directReads() const;

  // The records on the control connection, in host byte order. kDirect
  // and the answers to it carry the read's index e in `slot`;
  // kDirect also the allocation (`handle`, `allocationId`) and the
  // message's `offset` in it.
  struct Record {
    uint32_t kind;  // Kind
    uint32_t slot;
    uint64_t tag, check, total, offset, length;
    uint64_t allocationId;
    IpcHandle handle;
  };
  enum Kind : uint32_t {
    kChunk = 1,
    kCredit = 2,
    kDirect = 3,
    kDirectRead = 4,  // read queued, read[e] recorded after it
    kDirectRefused = 5,
    kDirectDeclined = 6,  // not now: this message through the slots, later ones in place
    kDirectDropped = 7,   // refused by a receive of a different call, unread
    kForget = 8,          // allocationId's owner freed it (peer-held memory): unmap it
  };
  struct Hello {
    uint64_t magic;
    uint32_t slots;
    uint32_t reserved;
    uint64_t slotBytes;
    IpcHandle pool;
    std::array<IpcHandle, kMaxSlots> filled, drained;
    std::array<IpcHandle, kDirectReads> ready, read;
  };
  struct Verdict {
    uint64_t magic;
    uint32_t mapped;  // 1: this end opened all the peer exported
    uint32_t reserved;
    char reason[240];  // why not, NUL-terminated
  };

 private:
  struct Chunk {
    uint64_t offset, length;
    uint32_t slot;
    // The spill block its bytes were copied to, the slot credited; null
    // while they are in the slot.
    uint8_t* spilledTo = nullptr;
  };
  struct PendingSend {
    const uint8_t* data;
    size_t bytes;
    Tag tag;
    RequestPtr request;
    size_t queued = 0;      // bytes whose copies are queued
    bool viaSlots = false;  // not read in place (its buffer or the peer cannot)
  };
  struct PostedRecv {
    uint8_t* dst;
    const uint8_t* local;
    size_t bytes;
    uint64_t check;
    Combiner combiner;
    RequestPtr request;
    size_t consumed = 0;
    bool arriving = false;  // its message began to arrive (chunks may not yet)
  };
  struct Unexpected {
    uint64_t check, total;
    std::vector<Chunk> chunks;
    // A message to read in place, its kDirect record; empty for chunks.
    std::optional<Record> direct;
    bool whole() const;  // every byte of it arrived
  };
  struct OutRecord {
    Record record;
    RequestPtr request;
  };

  CudaIpcConnection(Connection& control, std::unique_ptr<Connection> owned, uint8_t channel,
                    std::shared_ptr<IpcDevice> device, Options options);
  Status startHandshake();
  Status finishHandshake();
  // Opens what the peer's hello names; an error is why it could not.
  Status mapPeer();
  Status sendVerdict(const Status& opened);
  // Once both verdicts are known: ready_, or declined_.
  Status settleMapping();
  Status peerReasonOr(Status mine);
  Status sendRecord(const Record& record);
  void postRecordReceives();
  Status handleRecord(const Record& record);
  Status chunkArrived(const Record& record);
  Status pushSends(bool& moved);
  Status completeWrittenSends(bool& moved);
  // Queues the copy of `chunk` out of its slot (or spill block) into `p`
  // and credits the slot (or frees the block); completes `p` when its last
  // byte is queued.
  Status consume(PostedRecv& p, const Chunk& chunk);
  Status spillHeldChunks();
  // A free spill block; a new round of them if none is free.
  Result<uint8_t*> takeSpillBlock();
  // Carves `round` (slots blocks of slotBytes) into free blocks and keeps it.
  void addSpillRound(std::unique_ptr<DeviceMemory> round);
  size_t spillRoundBytes() const;
  Status matchUnexpected(uint64_t tag, PostedRecv& p, bool& done);
  void failPostedBefore(uint64_t tag);
  // Fails `p`, met by a message of another call (its check and size).
  void failDifferentCall(PostedRecv& p, uint64_t tag, uint64_t check, uint64_t total);
  // The entry of unexpected_ that the message of `record` starts or joins.
  Unexpected& unexpectedOf(const Record& record);
  // `callMark`: the failed call, for the peer (Connection::abortInCall).
  void failAll(const Status& reason, uint64_t callMark = 0);
  uint8_t* slot(uint32_t k) const;
  uint8_t* peerSlot(uint32_t k) const;

  // Reads in place (cuda_ipc_direct.cc).
  // Runs `work` if Options::ifMayMap lets it now; whether it did.
  bool mayMap(const std::function<void()>& work);
  Status createDirectEvents();
  Status openDirectEvents();
  // Sends `s` as a direct record if its size, its buffer, the peer and a
  // free read index allow it (`sent`), else marks it for the slots.
  Status trySendDirect(PendingSend& s, bool& sent);
  Status directArrived(const Record& record);
  Status directAnswered(const Record& record);
  // The peer's allocation a kDirect record names, opened or from the cache.
  Result<const uint8_t*> peerAllocation(const Record& record);
  Status readDirect(PostedRecv& p, const Record& record);
  // Answers `record` with `kind` (refused or declined); its chunks follow.
  Status declineDirect(const Record& record, Kind kind);
  // Peer-held allocations (braidMemAlloc's) this end named that their owner
  // freed since: the peer is told, so that it unmaps them (kForget). The
  // peer moves them aside and unmaps each at its next reserve() once its
  // reads of it have run.
  Status tellFreed();
  Status forgetArrived(const Record& record);
  // Those whose reads have run, taken out of forgotten_ (mutex_ held), to
  // be unmapped where mapping is allowed: at reserve(), or in progress()
  // through ifMayMap.
  std::vector<std::unique_ptr<DeviceMemory>> takeReadForgotten();
  void closeForgotten();
  // Opens the allocations declined while they could not be; outside mutex_.
  Status openPendingAllocations();
  void failDirectSends();

  std::unique_ptr<Connection> ownedControl_;
  Connection* const control_;
  const uint64_t channelBits_;  // of every record's tag
  std::shared_ptr<IpcDevice> device_;
  const Options options_;

  mutable std::mutex mutex_;
  Status dead_;
  bool abortedHere_ = false;  // dead_ by abort() on this end, not by the peer leaving
  std::unique_ptr<DeviceMemory> pool_;
  std::vector<std::unique_ptr<DeviceEvent>> filled_, drained_;
  Hello hello_{}, peerHello_{};
  RequestPtr helloSent_, helloReceived_;
  Verdict verdict_{}, peerVerdict_{};
  RequestPtr verdictSent_, verdictReceived_;
  // This end tried the peer's handles and said how it went.
  bool verdictGiven() const { return verdictSent_ != nullptr; }
  bool ready_ = false;  // both ends mapped: chunks and credits move
  Status declined_;     // non-ok once either end could not map
  std::unique_ptr<DeviceMemory> peerPool_;
  std::vector<std::unique_ptr<DeviceEvent>> peerFilled_, peerDrained_;

  // Records: tags 2, 3, ... in each direction after the hello (tag 0) and
  // the verdict (tag 1), in channel channelBits_.
  uint64_t nextRecordOut_ = 2, nextRecordIn_ = 2;
  std::deque<OutRecord> recordsOut_;
  struct InRecord {
    Record record{};
    RequestPtr request;
  };
  std::deque<InRecord> recordsIn_;

  std::deque<PendingSend> sends_;
  // Sends whose copies are queued, each with the request of its last record.
  std::deque<std::pair<RequestPtr, RequestPtr>> sentAwaitingRecord_;
  std::deque<uint32_t> freePeerSlots_;
  std::vector<bool> peerSlotWritten_;
  std::map<uint64_t, PostedRecv> posted_;
  std::map<uint64_t, Unexpected> unexpected_;
  // Messages refused by their receive whose chunks are still to come: the
  // bytes left, credited unread as they arrive.
  std::map<uint64_t, uint64_t> dropping_;
  size_t heldSlots_ = 0;
  size_t spilledChunks_ = 0;
  // Spill blocks. One goes back to freeSpillBlocks_ once the copy out of
  // it is queued (or its message was refused): the device runs its work in
  // order, so a later spill's copy into it comes after. The rounds are
  // freed with the connection, never during a call: freeing waits for the
  // whole GPU, which a CUDA stream waiting for this call may hold.
  std::vector<std::unique_ptr<DeviceMemory>> spillRounds_;
  std::vector<uint8_t*> freeSpillBlocks_;
  LatestArrivals latestArrived_;

  // Reads in place: this end's events and the peer's, by read index.
  std::vector<std::unique_ptr<DeviceEvent>> sourceReady_, sourceRead_, peerSourceReady_,
      peerSourceRead_;
  std::deque<uint32_t> freeDirect_;              // indices of this end's sends
  std::map<uint32_t, PendingSend> directSends_;  // by read index: awaiting the peer's answer
  bool peerReadsInPlace_ = true;                 // until it refuses one
  bool toldAllocationsFull_ = false;             // kMaxPeerAllocations reached, logged
  std::map<uint64_t, std::unique_ptr<DeviceMemory>> peerAllocations_;  // by id
  std::map<uint64_t, IpcHandle> pendingOpens_;  // by id: to open at the next reserve()
  std::set<uint64_t> opening_;                  // ids reserve() opens now, outside mutex_
  std::map<uint64_t, uint32_t> lastRead_;       // by id: the read index of its latest read
  struct Forgotten {
    std::unique_ptr<DeviceMemory> memory;
    int lastRead;  // its read index, or -1
  };
  std::vector<Forgotten> forgotten_;          // unmapped at reserve() once read
  std::set<uint64_t> forgottenWhileOpening_;  // kForget came while reserve() opened it
  std::set<uint64_t> namedHeld_;              // peer-held allocations named in kDirect records
  uint64_t heldFreedSeen_ = 0;                // IpcDevice::heldFreedSince
  Status cannotOpen_;                         // why an allocation would not open
  size_t directReads_ = 0;
};

}  // namespace braid::transport::cuda_ipc
