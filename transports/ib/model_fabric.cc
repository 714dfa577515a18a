// The model fabric: routes and executes the work requests of the model
// verbs' queue pairs and delivers their completions (model_fabric.h).
#include "transports/ib/model_fabric.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "src/common/strcat.h"

namespace braid::ib::model_internal {
namespace {

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

}  // namespace

Fabric::Fabric() {
  devices.push_back({"model0", {roceModelPort(0), infinibandModelPort(0)}});
  devices.push_back({"model1", {roceModelPort(1), infinibandModelPort(1)}});
}

QueuePairRecord* Fabric::findQp(uint32_t qpn) {
  auto it = qps.find(qpn);
  return it == qps.end() ? nullptr : it->second;
}

const ModelPortSpec* Fabric::port(size_t deviceIndex, uint8_t number) const {
  const auto& ports = devices[deviceIndex].ports;
  if (number < 1 || number > ports.size()) return nullptr;
  return &ports[number - 1];
}

// Where a packet from `from` arrives: the queue pair at the peer address,
// or null where hardware would get no answer.
QueuePairRecord* Fabric::route(const QueuePairRecord& from) {
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

void Fabric::push(CompletionQueueRecord& cq, const CompletionEntry& entry) {
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
void Fabric::completeSend(QueuePairRecord& qp, const PendingSend& wr, CompletionStatus status) {
  if (status == CompletionStatus::kSuccess && !wr.signaled) return;
  Completion c;
  c.wrId = wr.wrId;
  c.status = status;
  c.opcode = wr.isRead ? CompletionOpcode::kRdmaRead : CompletionOpcode::kRdmaWrite;
  c.byteLen = wr.local.bytes;
  push(*qp.sendCq, {c, qp.qpn, wr.sequence});
}

void Fabric::stopWaiting(QueuePairRecord& qp) {
  if (qp.waitingOnQpn == 0) return;
  if (QueuePairRecord* target = findQp(qp.waitingOnQpn)) std::erase(target->rnrWaiters, qp.qpn);
  qp.waitingOnQpn = 0;
  qp.rnrRetriesUsed = 0;
}

void Fabric::enterError(QueuePairRecord& qp) {
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
void Fabric::wakeRnrWaiters(QueuePairRecord& target) {
  std::vector<uint32_t> waiters;
  waiters.swap(target.rnrWaiters);
  for (uint32_t qpn : waiters) {
    QueuePairRecord* waiter = findQp(qpn);
    if (!waiter || waiter->waitingOnQpn != target.qpn) continue;
    waiter->waitingOnQpn = 0;
    progressSends(*waiter);
  }
}

Fabric::Outcome Fabric::execute(QueuePairRecord& qp, const PendingSend& wr) {
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
    if (!allowed || mr->second->pdId != target->pdId || !mr->second->covers(wr.remote.addr, bytes))
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
void Fabric::progressSends(QueuePairRecord& qp) {
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
void Fabric::countRnrRetries(CompletionQueueRecord& cq) {
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

Status Fabric::postSend(QueuePairRecord& qp, PendingSend wr) {
  if (qp.state != QueuePairState::kReadyToSend && qp.state != QueuePairState::kError)
    return invalidUsage(strCat("queue pair ", qp.qpn, ": cannot post a write in state ",
                               queuePairStateName(qp.state), "; sends need RTS"));
  if (qp.sendsPosted - qp.sendsReleased >= qp.capacity.maxSendWr)
    return systemError(
        strCat("queue pair ", qp.qpn, ": send queue full (", qp.capacity.maxSendWr,
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

void Fabric::destroyQp(QueuePairRecord& qp) {
  stopWaiting(qp);
  qps.erase(qp.qpn);
  std::erase(qp.sendCq->sendQps, qp.qpn);
  wakeRnrWaiters(qp);
}

}  // namespace braid::ib::model_internal
