// GPU memory over a host connection (tcp, shm, ib): each message goes
// through page-locked host memory, copied on the GPU's stream, so a GPU job
// (src/progress.h, Job::gpu) reaches peers that CUDA IPC cannot, such as
// ranks on other hosts.
//
// A send queues a copy of its GPU bytes into a pinned bounce buffer and an
// event after it; once the event has run, the bytes go to the host
// connection under the send's own tag. A receive lands in a bounce buffer;
// once it has arrived, a copy into its GPU destination (or a reduction
// straight from the bounce buffer) is queued on the stream and the receive
// is done: what the job queues after it runs after the copy. So the copies
// of one message overlap the wire time of the others, and a schedule that
// splits its data into chunks (ring, trees) keeps the copy engines and the
// wire busy together; within one message there is no overlap.
//
// Sends reach the host connection in the order they were posted (the tags
// of a channel must rise), each after its own copy. When the host
// connection dies, its requests fail as they would for its own users, and
// messages that arrived before still reach receives posted later; only a
// failure of the device ends this connection itself. Bounce buffers and
// events are kept for reuse until the connection goes: freeing pinned
// memory may wait for the whole GPU, which a CUDA stream waiting for this
// very call may hold.
//
// Pinned memory is bounded: each direction holds at most
// Options::bouncesPerDirection buffers, and a message posted while all are
// in use waits for one to come back rather than pinning more (a send until
// an earlier send has left; sends keep their order). reserve() pins ahead
// what a call's largest messages need, so that the call pins nothing while
// a CUDA stream waits for it. A receive waits only where waiting cannot
// deadlock: while a buffer that fits will come back without the peer's
// help (its message arrived), or while a buffer that fits is held by the
// receive of an earlier message of the same channel, which the peer,
// sending in the order of its tags, sends first. Otherwise it pins one
// more, as a schedule that posts a later receive before an earlier one may
// need.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "transports/cuda_ipc/ipc_device.h"
#include "transports/transport.h"

namespace braid::transport::gpu_staged {

class StagedConnection final : public Connection {
 public:
  struct Options {
    // Smallest bounce buffer: messages up to this size share buffers.
    size_t minBounceBytes = 512 * 1024;
    // Buffers of each direction before a message waits for one (see above).
    int bouncesPerDirection = 8;
  };

  // `host` carries the bytes and must outlive this connection; other users
  // may share it. `device` runs the copies, on the stream GPU jobs use.
  StagedConnection(Connection& host, std::shared_ptr<cuda_ipc::IpcDevice> device, Options options);
  ~StagedConnection() override;

  RequestPtr postSend(const void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecv(void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                            const Combiner& combiner) override;
  Result<bool> progress() override;
  int pollFd() const override { return host_.pollFd(); }
  bool wantsWrite() const override { return host_.wantsWrite(); }
  bool prepareToSleep() override;
  std::chrono::microseconds sleepAtMost() const override { return host_.sleepAtMost(); }
  void abort(const Status& reason) override { abortInCall(reason, 0); }
  void abortInCall(const Status& reason, uint64_t callMark) override;
  Status peerFailure() const override { return host_.peerFailure(); }
  bool ended() const override { return host_.ended(); }
  uint64_t peerFailedCall() const override { return host_.peerFailedCall(); }
  void forgetArrivalsBefore(uint64_t tag) override { host_.forgetArrivalsBefore(tag); }
  std::optional<Tag> unclaimed(uint8_t channel, uint64_t below) override {
    return host_.unclaimed(channel, below);
  }
  bool mayHaveUnclaimed() const override { return host_.mayHaveUnclaimed(); }
  int peer() const override { return host_.peer(); }
  // Pins buffers for the largest bouncesPerDirection messages each way.
  Status reserve(std::span<const size_t> sends, std::span<const size_t> recvs) override;

  // Pinned bounce buffers made so far (tests).
  size_t bounceBuffers() const;

 private:
  struct Bounce {
    std::unique_ptr<cuda_ipc::HostMemory> memory;
    size_t bytes = 0;
    void* data() const { return memory ? memory->data() : nullptr; }
  };
  // The buffers of one direction.
  struct Pool {
    std::multimap<size_t, Bounce> free;  // by size
    std::multiset<size_t> sizes;         // of every buffer, free or in use
    bool reserved = false;               // reserve() made buffers here
  };
  struct Send {
    RequestPtr request;
    const void* data = nullptr;  // on the GPU
    bool waiting = false;        // for a bounce buffer; its copy is not queued
    Bounce bounce;
    std::unique_ptr<cuda_ipc::DeviceEvent> copied;  // null: nothing to copy
    size_t bytes = 0;
    Tag tag;
    RequestPtr onHost;  // posted to the host connection once copied
  };
  struct Recv {
    RequestPtr request;
    Tag tag;
    bool waiting = false;  // for a bounce buffer; not yet posted to the host
    Bounce bounce;
    RequestPtr onHost;
    void* dst = nullptr;
    const void* local = nullptr;  // set for a reduction
    size_t bytes = 0;
    Combiner combiner;
    std::unique_ptr<cuda_ipc::DeviceEvent> drained;  // set once its copy is queued
  };

  // The smallest free buffer of `pool` of at least `bytes`, if any.
  static std::optional<Bounce> takeFree(Pool& pool, size_t bytes);
  // Whether `pool` may pin one more for `bytes`: it holds fewer than
  // bouncesPerDirection, or none that fits.
  bool hasRoom(const Pool& pool, size_t bytes) const;
  // A new buffer for `bytes`, counted in no pool; pinBounce() counts it.
  Result<Bounce> allocateBounce(size_t bytes);
  Result<Bounce> pinBounce(Pool& pool, size_t bytes);
  // Counts a new buffer in `pool`; keep() also makes it free.
  void count(Pool& pool, const Bounce& bounce);
  void keep(Pool& pool, Bounce bounce);
  // What reserve() must pin for `sizes` in `pool`, largest first.
  std::vector<size_t> missingBuffers(Pool& pool, std::span<const size_t> sizes);
  void giveBack(Pool& pool, Bounce bounce);
  // A buffer that queued copies may still use: never used again.
  void retire(Pool& pool, Bounce bounce);
  Result<std::unique_ptr<cuda_ipc::DeviceEvent>> takeEvent();
  void giveBack(std::unique_ptr<cuda_ipc::DeviceEvent> event);
  RequestPtr failed(Status error);
  // Takes a buffer for `s` and queues its copy; false: no buffer yet.
  Result<bool> startSend(Send& s);
  // The receives holding buffers, for the choice between waiting and
  // pinning one more (see above).
  struct RecvHolders {
    struct Pending {
      Tag tag;
      size_t bytes;  // of its buffer
    };
    std::vector<Pending> pending;  // whose message has yet to arrive
    size_t largestArrived = 0;     // a buffer that comes back without the peer
    bool mayWait(const Recv& r) const;
  };
  // Takes a buffer for `r` and posts it to the host, or pins one more
  // where waiting is not safe; false: it waits. Adds it to `holders`.
  Result<bool> startRecv(Recv& r, RecvHolders& holders);
  RecvHolders recvHolders() const;
  Status startWaiting(bool& moved);
  Status postCopiedSends(bool& moved);
  void finishSends(bool& moved);
  Status finishRecvs(bool& moved);
  // `callMark`: the failed call, for the peer (Connection::abortInCall).
  void failAll(const Status& reason, uint64_t callMark = 0);

  Connection& host_;
  std::shared_ptr<cuda_ipc::IpcDevice> device_;
  Options options_;
  mutable std::mutex mutex_;
  std::deque<Send> sends_;                      // in the order posted
  size_t sendsWaiting_ = 0;                     // the last ones of sends_
  std::vector<Recv> recvs_;                     // posted to the host
  std::multimap<uint64_t, Recv> waitingRecvs_;  // by tag value
  uint64_t bouncesReturned_ = 0;
  uint64_t returnsSeen_ = 0;  // by the last startWaiting()
  Pool sendPool_, recvPool_;
  std::vector<std::unique_ptr<cuda_ipc::DeviceEvent>> freeEvents_;
  std::vector<Bounce> retired_;  // may still be in queued copies; never reused
  size_t bounceBuffers_ = 0;
  Status dead_;
};

}  // namespace braid::transport::gpu_staged
