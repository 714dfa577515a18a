#include "transports/ib/model_verbs.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "src/common/strcat.h"

namespace braid::ib {
namespace {

constexpr uint32_t kPsnMask = 0xffffff;
constexpr uint8_t kRnrRetryWithoutEnd = 7;
constexpr uint32_t kMaxWorkRequests = 32768;
constexpr int kMaxCompletionQueueEntries = 1 << 20;

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

ModelPortSpec roceModelPort(uint8_t deviceNumber) {
  ModelPortSpec port;
  port.linkLayer = LinkLayer::kEthernet;
  Gid linkLocal;
  linkLocal.raw[0] = 0xfe;
  linkLocal.raw[1] = 0x80;
  linkLocal.raw[14] = deviceNumber;
  linkLocal.raw[15] = 1;
  Gid ipv4Mapped;
  ipv4Mapped.raw[10] = 0xff;
  ipv4Mapped.raw[11] = 0xff;
  ipv4Mapped.raw[12] = 10;
  ipv4Mapped.raw[15] = deviceNumber + 1;
  port.gids = {linkLocal, ipv4Mapped};
  return port;
}

ModelPortSpec infinibandModelPort(uint8_t deviceNumber) {
  ModelPortSpec port;
  port.linkLayer = LinkLayer::kInfiniBand;
  port.lid = static_cast<uint16_t>(1 + deviceNumber);
  Gid portGuid;
  portGuid.raw[0] = 0xfe;
  portGuid.raw[1] = 0x80;
  portGuid.raw[14] = deviceNumber;
  portGuid.raw[15] = 2;
  port.gids = {portGuid};
  return port;
}

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

  QueuePairRecord* findQp(uint32_t qpn) {
    auto it = qps.find(qpn);
    return it == qps.end() ? nullptr : it->second;
  }

  const ModelPortSpec* port(size_t deviceIndex, uint8_t number) const {
    const auto& ports = devices[deviceIndex].ports;
    if (number < 1 || number > ports.size()) return nullptr;
    return &ports[number - 1];
  }

  // Where a packet from `from` arrives: the queue pair at the peer address,
  // or null where hardware would get no answer.
  QueuePairRecord* route(const QueuePairRecord& from) {
    const QueuePairAddress& to = from.remote;
    QueuePairRecord* target = findQp(to.qpn);
    if (!target || target->port == 0) return nullptr;
    const ModelPortSpec* sourcePort = port(from.deviceIndex, from.port);
    const ModelPortSpec* targetPort = port(target->deviceIndex, target->port);
    if (!sourcePort || sourcePort->state != PortState::kActive || !targetPort ||
        targetPort->state != PortState::kActive)
      return nullptr;
    if (!to.gid.isZero()) {
      if (std::find(targetPort->gids.begin(), targetPort->gids.end(), to.gid) ==
          targetPort->gids.end())
        return nullptr;
    } else if (targetPort->linkLayer != LinkLayer::kInfiniBand || targetPort->lid != to.lid) {
      return nullptr;
    }
    return target;
  }

  void push(CompletionQueueRecord& cq, const CompletionEntry& entry) {
    if (!cq.overrun.empty()) return;
    if (cq.entries.size() >= static_cast<size_t>(cq.capacity)) {
      cq.overrun =
          strCat("completion queue overrun: a completion (work request ", entry.completion.wrId,
                 ", queue pair ", entry.qpn, ") arrived with all ", cq.capacity,
                 " entries waiting to be polled; the queue is lost, as on hardware "
                 "(IBV_EVENT_CQ_ERR)");
      return;
    }
    cq.entries.push_back(entry);
    if (cq.armed && cq.wakeFd >= 0) {
      cq.armed = false;
      const uint64_t one = 1;
      (void)!::write(cq.wakeFd, &one, sizeof one);
    }
  }

  // Errors always complete; successes only when signaled, as in verbs.
  void completeSend(QueuePairRecord& qp, const PendingSend& wr, CompletionStatus status) {
    if (status == CompletionStatus::kSuccess && !wr.signaled) return;
    Completion c;
    c.wrId = wr.wrId;
    c.status = status;
    c.opcode = wr.isRead ? CompletionOpcode::kRdmaRead : CompletionOpcode::kRdmaWrite;
    c.byteLen = wr.local.bytes;
    push(*qp.sendCq, {c, qp.qpn, wr.sequence});
  }

  void stopWaiting(QueuePairRecord& qp) {
    if (qp.waitingOnQpn == 0) return;
    if (QueuePairRecord* target = findQp(qp.waitingOnQpn)) std::erase(target->rnrWaiters, qp.qpn);
    qp.waitingOnQpn = 0;
    qp.rnrRetriesUsed = 0;
  }

  void enterError(QueuePairRecord& qp) {
    if (qp.state == QueuePairState::kError) return;
    qp.state = QueuePairState::kError;
    stopWaiting(qp);
    while (!qp.sends.empty()) {
      PendingSend wr = qp.sends.front();
      qp.sends.pop_front();
      completeSend(qp, wr, CompletionStatus::kWorkRequestFlushError);
    }
    while (!qp.recvs.empty()) {
      Completion c;
      c.wrId = qp.recvs.front().wrId;
      c.status = CompletionStatus::kWorkRequestFlushError;
      c.opcode = CompletionOpcode::kRecv;
      qp.recvs.pop_front();
      push(*qp.recvCq, {c, qp.qpn, 0});
    }
    wakeRnrWaiters(qp);
  }

  // Writers waiting for a receive at `target` try again: one was posted,
  // or the target is gone or broken and they fail.
  void wakeRnrWaiters(QueuePairRecord& target) {
    std::vector<uint32_t> waiters;
    waiters.swap(target.rnrWaiters);
    for (uint32_t qpn : waiters) {
      QueuePairRecord* waiter = findQp(qpn);
      if (!waiter || waiter->waitingOnQpn != target.qpn) continue;
      waiter->waitingOnQpn = 0;
      progressSends(*waiter);
    }
  }

  struct Outcome {
    CompletionStatus status = CompletionStatus::kSuccess;
    QueuePairRecord* waitFor = nullptr;  // receiver not ready: wait for its receive
  };

  Outcome execute(QueuePairRecord& qp, const PendingSend& wr) {
    const uint32_t bytes = wr.local.bytes;
    if (bytes > 0) {
      auto mr = byLkey.find(wr.local.lkey);
      // A read writes its local buffer, which verbs checks for local write.
      if (mr == byLkey.end() || mr->second->pdId != qp.pdId ||
          !mr->second->covers(reinterpret_cast<uintptr_t>(wr.local.addr), bytes) ||
          (wr.isRead && !mr->second->access.localWrite))
        return {CompletionStatus::kLocalProtectionError};
    }
    QueuePairRecord* target = route(qp);
    if (!target ||
        (target->state != QueuePairState::kReadyToReceive &&
         target->state != QueuePairState::kReadyToSend) ||
        target->remote.qpn != qp.qpn || target->expectedPsn != qp.sendPsn)
      return {CompletionStatus::kRetryExceeded};
    if (bytes > 0) {
      auto mr = byRkey.find(wr.remote.rkey);
      const bool allowed =
          wr.isRead
              ? mr != byRkey.end() && mr->second->access.remoteRead && target->access.remoteRead
              : mr != byRkey.end() && mr->second->access.remoteWrite && target->access.remoteWrite;
      if (!allowed || mr->second->pdId != target->pdId ||
          !mr->second->covers(wr.remote.addr, bytes))
        return {CompletionStatus::kRemoteAccessError};
    }
    if (wr.withImm && target->recvs.empty()) {
      if (qp.rnrRetry == 0) return {CompletionStatus::kRnrRetryExceeded};
      return {CompletionStatus::kSuccess, target};
    }
    if (bytes > 0 && wr.isRead)
      std::memmove(wr.local.addr, reinterpret_cast<void*>(static_cast<uintptr_t>(wr.remote.addr)),
                   bytes);
    else if (bytes > 0)
      std::memmove(reinterpret_cast<void*>(static_cast<uintptr_t>(wr.remote.addr)), wr.local.addr,
                   bytes);
    const uint32_t packets = std::max<uint32_t>(
        1, (bytes + static_cast<uint32_t>(mtuBytes(qp.mtu)) - 1) / mtuBytes(qp.mtu));
    qp.sendPsn = (qp.sendPsn + packets) & kPsnMask;
    target->expectedPsn = (target->expectedPsn + packets) & kPsnMask;
    if (wr.withImm) {
      Completion c;
      c.wrId = target->recvs.front().wrId;
      c.opcode = CompletionOpcode::kRecvRdmaWithImm;
      c.byteLen = bytes;
      c.imm = wr.imm;
      c.hasImm = true;
      target->recvs.pop_front();
      push(*target->recvCq, {c, target->qpn, 0});
    }
    return {};
  }

  // Runs the posted sends in order until one must wait or fails.
  void progressSends(QueuePairRecord& qp) {
    while (qp.waitingOnQpn == 0 && !qp.sends.empty() && qp.state == QueuePairState::kReadyToSend) {
      Outcome outcome = execute(qp, qp.sends.front());
      if (outcome.waitFor) {
        qp.waitingOnQpn = outcome.waitFor->qpn;
        outcome.waitFor->rnrWaiters.push_back(qp.qpn);
        return;
      }
      qp.rnrRetriesUsed = 0;
      PendingSend done = qp.sends.front();
      qp.sends.pop_front();
      completeSend(qp, done, outcome.status);
      if (outcome.status != CompletionStatus::kSuccess) enterError(qp);
    }
  }

  // A poll of a send queue stands in for one RNR timer period.
  void countRnrRetries(CompletionQueueRecord& cq) {
    std::vector<uint32_t> senders = cq.sendQps;
    for (uint32_t qpn : senders) {
      QueuePairRecord* qp = findQp(qpn);
      if (!qp || qp->waitingOnQpn == 0 || qp->rnrRetry == kRnrRetryWithoutEnd) continue;
      if (++qp->rnrRetriesUsed < qp->rnrRetry) continue;
      stopWaiting(*qp);
      PendingSend failed = qp->sends.front();
      qp->sends.pop_front();
      completeSend(*qp, failed, CompletionStatus::kRnrRetryExceeded);
      enterError(*qp);
    }
  }

  Status postSend(QueuePairRecord& qp, PendingSend wr) {
    if (qp.state != QueuePairState::kReadyToSend && qp.state != QueuePairState::kError)
      return invalidUsage(strCat("queue pair ", qp.qpn, ": cannot post a write in state ",
                                 queuePairStateName(qp.state), "; sends need RTS"));
    if (qp.sendsPosted - qp.sendsReleased >= qp.capacity.maxSendWr)
      return systemError(strCat(
          "queue pair ", qp.qpn, ": send queue full (", qp.capacity.maxSendWr,
          " work requests not yet released: a slot is freed when its completion is polled, an "
          "unsignaled one when a later signaled one is)"));
    wr.sequence = ++qp.sendsPosted;
    if (qp.state == QueuePairState::kError) {
      completeSend(qp, wr, CompletionStatus::kWorkRequestFlushError);
      return Status::ok();
    }
    qp.sends.push_back(wr);
    progressSends(qp);
    return Status::ok();
  }

  void destroyQp(QueuePairRecord& qp) {
    stopWaiting(qp);
    qps.erase(qp.qpn);
    std::erase(qp.sendCq->sendQps, qp.qpn);
    wakeRnrWaiters(qp);
  }

 private:
  Fabric() {
    devices.push_back({"model0", {roceModelPort(0), infinibandModelPort(0)}});
    devices.push_back({"model1", {roceModelPort(1), infinibandModelPort(1)}});
  }
};

class ModelMemoryRegion final : public MemoryRegion {
 public:
  explicit ModelMemoryRegion(std::unique_ptr<MemoryRegionRecord> record)
      : MemoryRegion(reinterpret_cast<void*>(record->begin), record->length, record->lkey,
                     record->rkey),
        record_(std::move(record)) {}
  ~ModelMemoryRegion() override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    f.byLkey.erase(record_->lkey);
    f.byRkey.erase(record_->rkey);
  }

 private:
  std::unique_ptr<MemoryRegionRecord> record_;
};

class ModelCompletionQueue final : public CompletionQueue {
 public:
  explicit ModelCompletionQueue(std::shared_ptr<CompletionQueueRecord> record)
      : record_(std::move(record)) {}
  ~ModelCompletionQueue() override {
    // Queue pairs still using the record keep it; its entries go with it.
    std::lock_guard lock(Fabric::get().mu);
    record_.reset();
  }

  Result<int> poll(std::span<Completion> out) override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    f.countRnrRetries(*record_);
    if (!record_->overrun.empty()) return systemError(record_->overrun);
    int n = 0;
    while (n < static_cast<int>(out.size()) && !record_->entries.empty()) {
      const CompletionEntry& entry = record_->entries.front();
      out[n++] = entry.completion;
      if (entry.releasesSendsThrough != 0)
        if (QueuePairRecord* qp = f.findQp(entry.qpn))
          qp->sendsReleased = std::max(qp->sendsReleased, entry.releasesSendsThrough);
      record_->entries.pop_front();
    }
    return n;
  }

  int capacity() const override { return record_->capacity; }
  int wakeFd() const override { return record_->wakeFd; }
  Status armWake() override {
    std::lock_guard lock(Fabric::get().mu);
    record_->armed = true;
    return Status::ok();
  }
  void consumeWake() override {
    uint64_t count = 0;
    (void)!::read(record_->wakeFd, &count, sizeof count);
  }
  const std::shared_ptr<CompletionQueueRecord>& record() const { return record_; }

 private:
  std::shared_ptr<CompletionQueueRecord> record_;
};

class ModelQueuePair final : public QueuePair {
 public:
  explicit ModelQueuePair(std::unique_ptr<QueuePairRecord> record) : record_(std::move(record)) {}
  ~ModelQueuePair() override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    f.destroyQp(*record_);
    record_.reset();
  }

  uint32_t qpn() const override { return record_->qpn; }

  QueuePairState state() const override {
    std::lock_guard lock(Fabric::get().mu);
    return record_->state;
  }

  Status toInit(uint8_t port, AccessFlags access) override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    QueuePairRecord& qp = *record_;
    if (qp.state != QueuePairState::kReset)
      return refuseTransition(qp.qpn, qp.state, QueuePairState::kInit);
    if (!f.port(qp.deviceIndex, port))
      return invalidArgument(strCat("queue pair ", qp.qpn, ": ", f.devices[qp.deviceIndex].name,
                                    " has no port ", static_cast<int>(port)));
    qp.port = port;
    qp.access = access;
    qp.state = QueuePairState::kInit;
    return Status::ok();
  }

  Status toReadyToReceive(const QueuePairAddress& remote, Mtu mtu) override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    QueuePairRecord& qp = *record_;
    if (qp.state != QueuePairState::kInit)
      return refuseTransition(qp.qpn, qp.state, QueuePairState::kReadyToReceive);
    const ModelPortSpec& port = *f.port(qp.deviceIndex, qp.port);
    if (mtu < Mtu::k256 || mtu > port.activeMtu)
      return invalidArgument(strCat("queue pair ", qp.qpn, ": path MTU ", mtuBytes(mtu),
                                    " beyond the port's active MTU ", mtuBytes(port.activeMtu)));
    if (remote.gid.isZero() && port.linkLayer == LinkLayer::kEthernet)
      return invalidArgument(
          strCat("queue pair ", qp.qpn, ": a RoCE path needs the peer's GID (it has no LID)"));
    if (!remote.gid.isZero() &&
        (remote.gidIndex < 0 || remote.gidIndex >= static_cast<int>(port.gids.size())))
      return invalidArgument(strCat("queue pair ", qp.qpn, ": GID index ", remote.gidIndex,
                                    " beyond the port's ", port.gids.size(), " GIDs"));
    qp.remote = remote;
    qp.mtu = mtu;
    qp.expectedPsn = remote.psn & kPsnMask;
    qp.state = QueuePairState::kReadyToReceive;
    return Status::ok();
  }

  Status toReadyToSend(uint32_t psn, uint8_t timeout, uint8_t retryCount,
                       uint8_t rnrRetry) override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    QueuePairRecord& qp = *record_;
    if (qp.state != QueuePairState::kReadyToReceive)
      return refuseTransition(qp.qpn, qp.state, QueuePairState::kReadyToSend);
    if (timeout > 31 || retryCount > 7 || rnrRetry > 7)
      return invalidArgument(strCat("queue pair ", qp.qpn, ": timeout ", int{timeout},
                                    " (0..31), retry count ", int{retryCount}, ", RNR retry ",
                                    int{rnrRetry}, " (0..7)"));
    qp.sendPsn = psn & kPsnMask;
    qp.rnrRetry = rnrRetry;
    qp.state = QueuePairState::kReadyToSend;
    return Status::ok();
  }

  Status postRecv(uint64_t wrId, const LocalBuffer& buffer) override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    QueuePairRecord& qp = *record_;
    if (qp.state == QueuePairState::kReset)
      return invalidUsage(strCat("queue pair ", qp.qpn,
                                 ": cannot post a receive in state RESET; receives need INIT"));
    if (qp.recvs.size() >= qp.capacity.maxRecvWr)
      return systemError(strCat("queue pair ", qp.qpn, ": receive queue full (",
                                qp.capacity.maxRecvWr, " posted)"));
    if (qp.state == QueuePairState::kError) {
      Completion c;
      c.wrId = wrId;
      c.status = CompletionStatus::kWorkRequestFlushError;
      c.opcode = CompletionOpcode::kRecv;
      f.push(*qp.recvCq, {c, qp.qpn, 0});
      return Status::ok();
    }
    qp.recvs.push_back({wrId, buffer});
    f.wakeRnrWaiters(qp);
    return Status::ok();
  }

  Status postWriteWithImm(uint64_t wrId, const LocalBuffer& local, const RemoteBuffer& remote,
                          uint32_t imm, bool signaled) override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    return f.postSend(*record_, {wrId, local, remote, true, imm, signaled});
  }

  Status postWrite(uint64_t wrId, const LocalBuffer& local, const RemoteBuffer& remote,
                   bool signaled) override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    return f.postSend(*record_, {wrId, local, remote, false, 0, signaled});
  }

  Status postRead(uint64_t wrId, const LocalBuffer& local, const RemoteBuffer& remote,
                  bool signaled) override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    PendingSend wr{wrId, local, remote, false, 0, signaled};
    wr.isRead = true;
    return f.postSend(*record_, wr);
  }

 private:
  std::unique_ptr<QueuePairRecord> record_;
};

class ModelProtectionDomain final : public ProtectionDomain {
 public:
  ModelProtectionDomain(size_t deviceIndex, uint64_t id) : deviceIndex_(deviceIndex), id_(id) {}

  Result<std::unique_ptr<MemoryRegion>> registerMemory(void* addr, size_t bytes,
                                                       AccessFlags access) override {
    if (!addr || bytes == 0)
      return invalidArgument(strCat("cannot register ", bytes, " bytes at ", addr));
    if (access.remoteWrite && !access.localWrite)
      return invalidArgument("remote write access needs local write access (ibv_reg_mr: EINVAL)");
    auto record = std::make_unique<MemoryRegionRecord>();
    record->pdId = id_;
    record->begin = reinterpret_cast<uintptr_t>(addr);
    record->length = bytes;
    record->access = access;
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    // Distinct lkey and rkey, so a transport that sends one for the other
    // fails here as it would on hardware that keys them apart.
    const uint32_t key = f.nextKey++;
    record->lkey = key * 2;
    record->rkey = key * 2 + 1;
    f.byLkey[record->lkey] = record.get();
    f.byRkey[record->rkey] = record.get();
    return std::unique_ptr<MemoryRegion>(new ModelMemoryRegion(std::move(record)));
  }

  Result<std::unique_ptr<QueuePair>> createQueuePair(CompletionQueue& sendCq,
                                                     CompletionQueue& recvCq,
                                                     QueuePairCapacity capacity) override {
    auto* send = dynamic_cast<ModelCompletionQueue*>(&sendCq);
    auto* recv = dynamic_cast<ModelCompletionQueue*>(&recvCq);
    if (!send || !recv) return invalidArgument("completion queues of another verbs implementation");
    if (send->record()->deviceIndex != deviceIndex_ || recv->record()->deviceIndex != deviceIndex_)
      return invalidArgument("completion queues of another device");
    if (capacity.maxSendWr < 1 || capacity.maxSendWr > kMaxWorkRequests || capacity.maxRecvWr < 1 ||
        capacity.maxRecvWr > kMaxWorkRequests)
      return invalidArgument(strCat("queue pair capacity ", capacity.maxSendWr, " sends, ",
                                    capacity.maxRecvWr, " receives (1..", kMaxWorkRequests, ")"));
    auto record = std::make_unique<QueuePairRecord>();
    record->deviceIndex = deviceIndex_;
    record->pdId = id_;
    record->sendCq = send->record();
    record->recvCq = recv->record();
    record->capacity = capacity;
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    record->qpn = f.nextQpn++;
    f.qps[record->qpn] = record.get();
    record->sendCq->sendQps.push_back(record->qpn);
    return std::unique_ptr<QueuePair>(new ModelQueuePair(std::move(record)));
  }

 private:
  size_t deviceIndex_;
  uint64_t id_;
};

class ModelDevice final : public Device {
 public:
  ModelDevice(size_t index, std::string name) : index_(index), name_(std::move(name)) {}

  const std::string& name() const override { return name_; }

  Result<PortInfo> queryPort(uint8_t port) override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    const ModelPortSpec* spec = f.port(index_, port);
    if (!spec) return invalidArgument(strCat(name_, " has no port ", int{port}));
    PortInfo info;
    info.state = spec->state;
    info.linkLayer = spec->linkLayer;
    info.lid = spec->lid;
    info.gidTableLength = static_cast<int>(spec->gids.size());
    info.activeMtu = spec->activeMtu;
    return info;
  }

  Result<Gid> queryGid(uint8_t port, int index) override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    const ModelPortSpec* spec = f.port(index_, port);
    if (!spec) return invalidArgument(strCat(name_, " has no port ", int{port}));
    if (index < 0 || index >= static_cast<int>(spec->gids.size()))
      return invalidArgument(strCat(name_, " port ", int{port}, " has no GID ", index));
    return spec->gids[index];
  }

  Result<std::unique_ptr<ProtectionDomain>> allocProtectionDomain() override {
    Fabric& f = Fabric::get();
    std::lock_guard lock(f.mu);
    return std::unique_ptr<ProtectionDomain>(new ModelProtectionDomain(index_, f.nextPdId++));
  }

  Result<std::unique_ptr<CompletionQueue>> createCompletionQueue(int entries) override {
    if (entries < 1 || entries > kMaxCompletionQueueEntries)
      return invalidArgument(strCat("completion queue of ", entries, " entries (1..",
                                    kMaxCompletionQueueEntries, ")"));
    auto record = std::make_shared<CompletionQueueRecord>();
    record->deviceIndex = index_;
    record->capacity = entries;
    record->wakeFd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (record->wakeFd < 0) return errnoStatus("eventfd for a completion queue", errno);
    return std::unique_ptr<CompletionQueue>(new ModelCompletionQueue(std::move(record)));
  }

 private:
  size_t index_;
  std::string name_;
};

}  // namespace

Status addModelDevice(const ModelDeviceSpec& spec) {
  Fabric& f = Fabric::get();
  std::lock_guard lock(f.mu);
  if (spec.name.empty() || spec.ports.empty())
    return invalidArgument("a model device needs a name and a port");
  for (const ModelDeviceSpec& d : f.devices) {
    if (d.name == spec.name) return invalidArgument(strCat("model device ", spec.name, " exists"));
    for (const ModelPortSpec& p : d.ports)
      for (const ModelPortSpec& q : spec.ports)
        for (const Gid& gid : q.gids)
          if (std::find(p.gids.begin(), p.gids.end(), gid) != p.gids.end())
            return invalidArgument(strCat("GID ", toString(gid), " is ", d.name, "'s already"));
  }
  f.devices.push_back(spec);
  return Status::ok();
}

Result<std::unique_ptr<Device>> openModelDevice(const std::string& name) {
  Fabric& f = Fabric::get();
  std::lock_guard lock(f.mu);
  std::string names;
  for (size_t i = 0; i < f.devices.size(); ++i) {
    if (name.empty() || f.devices[i].name == name)
      return std::unique_ptr<Device>(new ModelDevice(i, f.devices[i].name));
    names += strCat(i == 0 ? "" : ", ", f.devices[i].name);
  }
  return invalidArgument(strCat("no model device \"", name, "\" (there are ", names, ")"));
}

}  // namespace braid::ib
