// The model verbs' handles (devices, protection domains, memory regions,
// completion queues, queue pairs) over the model fabric (model_fabric.h), and
// the functions that add and open model devices.
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
#include "transports/ib/model_fabric.h"

namespace braid::ib {

using namespace model_internal;

namespace {

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