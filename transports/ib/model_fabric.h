// Internal to the model verbs (model_verbs.cc, model_fabric.cc): the records
// behind the model's handles and the Fabric that connects them, which routes
// and executes work requests and delivers their completions.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "transports/ib/model_verbs.h"

namespace braid::ib::model_internal {

inline constexpr uint32_t kPsnMask = 0xffffff;
inline constexpr uint8_t kRnrRetryWithoutEnd = 7;
inline constexpr uint32_t kMaxWorkRequests = 32768;
inline constexpr int kMaxCompletionQueueEntries = 1 << 20;

struct MemoryRegionRecord {
  uint64_t pdId = 0;
  uintptr_t begin = 0;
  size_t length = 0;
  AccessFlags access;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
  bool covers(uint64_t addr, uint64_t bytes) const {
    return addr >= begin && bytes <= length && addr - begin <= length - bytes;
  }
};

struct PendingSend {
  uint64_t wrId = 0;
  LocalBuffer local;
  RemoteBuffer remote;
  bool withImm = false;
  uint32_t imm = 0;
  bool signaled = false;
  uint64_t sequence = 0;  // position in the send queue, for slot release
  bool isRead = false;    // an RDMA read: remote -> local
};

struct PendingRecv {
  uint64_t wrId = 0;
  LocalBuffer buffer;  // kept for the record: writes never fill it
};

struct CompletionEntry {
  Completion completion;
  uint32_t qpn = 0;
  uint64_t releasesSendsThrough = 0;  // zero for receive completions
};

struct CompletionQueueRecord {
  ~CompletionQueueRecord() {
    if (wakeFd >= 0) ::close(wakeFd);
  }
  size_t deviceIndex = 0;
  int capacity = 0;
  int wakeFd = -1;  // an eventfd, written when a completion comes while armed
  bool armed = false;
  std::deque<CompletionEntry> entries;
  std::string overrun;            // why the queue is lost; empty while usable
  std::vector<uint32_t> sendQps;  // whose RNR retries its polls count
};

struct QueuePairRecord {
  uint32_t qpn = 0;
  size_t deviceIndex = 0;
  uint64_t pdId = 0;
  std::shared_ptr<CompletionQueueRecord> sendCq;
  std::shared_ptr<CompletionQueueRecord> recvCq;
  QueuePairCapacity capacity;
  QueuePairState state = QueuePairState::kReset;
  uint8_t port = 0;
  AccessFlags access;
  QueuePairAddress remote;
  Mtu mtu = Mtu::k1024;
  uint32_t sendPsn = 0;      // next PSN this side sends
  uint32_t expectedPsn = 0;  // next PSN this side accepts
  uint8_t rnrRetry = 0;
  std::deque<PendingRecv> recvs;
  // Posted and not yet executed: only while the head waits for the target
  // to post a receive, or not at all.
  std::deque<PendingSend> sends;
  uint64_t sendsPosted = 0;
  uint64_t sendsReleased = 0;
  uint32_t waitingOnQpn = 0;  // the target whose receive the head waits for
  int rnrRetriesUsed = 0;
  std::vector<uint32_t> rnrWaiters;  // queue pairs waiting for a receive here
};

// Everything below runs with `mu` held.
class Fabric {
 public:
  static Fabric& get() {
    // Never destroyed: handles may outlive static destruction order.
    static Fabric* fabric = new Fabric();
    return *fabric;
  }

  std::mutex mu;
  std::vector<ModelDeviceSpec> devices;
  std::unordered_map<uint32_t, QueuePairRecord*> qps;
  std::unordered_map<uint32_t, MemoryRegionRecord*> byLkey;
  std::unordered_map<uint32_t, MemoryRegionRecord*> byRkey;
  uint32_t nextQpn = 0x100;
  uint32_t nextKey = 0x1000;
  uint64_t nextPdId = 1;

  QueuePairRecord* findQp(uint32_t qpn);

  const ModelPortSpec* port(size_t deviceIndex, uint8_t number) const;

  // Where a packet from `from` arrives: the queue pair at the peer address,
  // or null where hardware would get no answer.
  QueuePairRecord* route(const QueuePairRecord& from);

  void push(CompletionQueueRecord& cq, const CompletionEntry& entry);

  // Errors always complete; successes only when signaled, as in verbs.
  void completeSend(QueuePairRecord& qp, const PendingSend& wr, CompletionStatus status);

  void stopWaiting(QueuePairRecord& qp);

  void enterError(QueuePairRecord& qp);

  // Writers waiting for a receive at `target` try again: one was posted,
  // or the target is gone or broken and they fail.
  void wakeRnrWaiters(QueuePairRecord& target);

  struct Outcome {
    CompletionStatus status = CompletionStatus::kSuccess;
    QueuePairRecord* waitFor = nullptr;  // receiver not ready: wait for its receive
  };

  Outcome execute(QueuePairRecord& qp, const PendingSend& wr);

  // Runs the posted sends in order until one must wait or fails.
  void progressSends(QueuePairRecord& qp);

  // A poll of a send queue stands in for one RNR timer period.
  void countRnrRetries(CompletionQueueRecord& cq);

  Status postSend(QueuePairRecord& qp, PendingSend wr);

  void destroyQp(QueuePairRecord& qp);

 private:
  Fabric();
};

}  // namespace braid::ib::model_internal
