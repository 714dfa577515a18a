#include "transports/ib/real_verbs.h"

#include <endian.h>
#include <fcntl.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "src/common/strcat.h"
#include "transports/ib/verbs_library.h"

namespace braid::ib {
namespace {

// braid's enumerators are verbs' values, so results map by a cast.
static_assert(static_cast<int>(CompletionStatus::kSuccess) == IBV_WC_SUCCESS);
static_assert(static_cast<int>(CompletionStatus::kLocalLengthError) == IBV_WC_LOC_LEN_ERR);
static_assert(static_cast<int>(CompletionStatus::kLocalProtectionError) == IBV_WC_LOC_PROT_ERR);
static_assert(static_cast<int>(CompletionStatus::kWorkRequestFlushError) == IBV_WC_WR_FLUSH_ERR);
static_assert(static_cast<int>(CompletionStatus::kRemoteAccessError) == IBV_WC_REM_ACCESS_ERR);
static_assert(static_cast<int>(CompletionStatus::kRetryExceeded) == IBV_WC_RETRY_EXC_ERR);
static_assert(static_cast<int>(CompletionStatus::kRnrRetryExceeded) == IBV_WC_RNR_RETRY_EXC_ERR);
static_assert(static_cast<int>(CompletionStatus::kGeneralError) == IBV_WC_GENERAL_ERR);
static_assert(static_cast<int>(CompletionOpcode::kSend) == IBV_WC_SEND);
static_assert(static_cast<int>(CompletionOpcode::kRdmaWrite) == IBV_WC_RDMA_WRITE);
static_assert(static_cast<int>(CompletionOpcode::kRdmaRead) == IBV_WC_RDMA_READ);
static_assert(static_cast<int>(CompletionOpcode::kRecv) == IBV_WC_RECV);
static_assert(static_cast<int>(CompletionOpcode::kRecvRdmaWithImm) == IBV_WC_RECV_RDMA_WITH_IMM);
static_assert(static_cast<int>(QueuePairState::kReset) == IBV_QPS_RESET);
static_assert(static_cast<int>(QueuePairState::kInit) == IBV_QPS_INIT);
static_assert(static_cast<int>(QueuePairState::kReadyToReceive) == IBV_QPS_RTR);
static_assert(static_cast<int>(QueuePairState::kReadyToSend) == IBV_QPS_RTS);
static_assert(static_cast<int>(QueuePairState::kError) == IBV_QPS_ERR);
static_assert(static_cast<int>(PortState::kActive) == IBV_PORT_ACTIVE);
static_assert(static_cast<int>(LinkLayer::kEthernet) == IBV_LINK_LAYER_ETHERNET);
static_assert(static_cast<int>(Mtu::k256) == IBV_MTU_256);
static_assert(static_cast<int>(Mtu::k4096) == IBV_MTU_4096);

using Library = std::shared_ptr<const VerbsLibrary>;

constexpr uint32_t kPsnMask = 0xffffff;
// 0.64 ms before a receiver-not-ready sender tries again (verbs' encoding).
constexpr uint8_t kMinRnrTimer = 12;
constexpr uint8_t kHopLimit = 255;
constexpr int kPollBatch = 32;

// A verbs call that returned null: errno says why, when the provider set it
// (read at once by the caller: building the message may change it).
Status failedCall(const std::string& what, int err) {
  return err != 0 ? errnoStatus(what, err) : systemError(what + ": failed (errno not set)");
}

int accessBits(AccessFlags access) {
  return (access.localWrite ? IBV_ACCESS_LOCAL_WRITE : 0) |
         (access.remoteWrite ? IBV_ACCESS_REMOTE_WRITE : 0) |
         (access.remoteRead ? IBV_ACCESS_REMOTE_READ : 0);
}

class VerbsMemoryRegion final : public MemoryRegion {
 public:
  VerbsMemoryRegion(Library lib, std::shared_ptr<ibv_pd> pd, ibv_mr* mr)
      : MemoryRegion(mr->addr, mr->length, mr->lkey, mr->rkey),
        lib_(std::move(lib)),
        pd_(std::move(pd)),
        mr_(mr) {}
  ~VerbsMemoryRegion() override { lib_->deregMr(mr_); }

 private:
  Library lib_;
  std::shared_ptr<ibv_pd> pd_;  // deallocated after the region
  ibv_mr* mr_;
};

// A completion queue with its own completion channel, whose fd is the
// queue's wakeFd(). Events taken from the channel are acknowledged before
// the queue is destroyed, as verbs requires.
class VerbsCompletionQueue final : public CompletionQueue {
 public:
  VerbsCompletionQueue(Library lib, std::shared_ptr<ibv_comp_channel> channel,
                       std::shared_ptr<ibv_cq> cq)
      : lib_(std::move(lib)), channel_(std::move(channel)), cq_(std::move(cq)) {}
  ~VerbsCompletionQueue() override {
    if (unacknowledged_ > 0) lib_->ackCqEvents(cq_.get(), unacknowledged_);
  }

  int wakeFd() const override { return channel_->fd; }
  Status armWake() override {
    if (int err = ibv_req_notify_cq(cq_.get(), 0); err != 0)
      return systemError(strCat("ibv_req_notify_cq failed (", err, ")"));
    return Status::ok();
  }
  void consumeWake() override {
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    // The channel's fd is nonblocking: this takes what has fired, no more.
    while (lib_->getCqEvent(channel_.get(), &cq, &context) == 0) ++unacknowledged_;
    if (unacknowledged_ >= 64) {
      lib_->ackCqEvents(cq_.get(), unacknowledged_);
      unacknowledged_ = 0;
    }
  }

  Result<int> poll(std::span<Completion> out) override {
    std::array<ibv_wc, kPollBatch> wcs;
    int total = 0;
    while (total < static_cast<int>(out.size())) {
      const int want = std::min<int>(kPollBatch, static_cast<int>(out.size()) - total);
      const int n = ibv_poll_cq(cq_.get(), want, wcs.data());
      if (n < 0) return systemError(strCat("ibv_poll_cq failed (", n, ")"));
      for (int i = 0; i < n; ++i) {
        const ibv_wc& wc = wcs[i];
        Completion& c = out[total + i];
        c.wrId = wc.wr_id;
        c.status = static_cast<CompletionStatus>(wc.status);
        c.opcode = static_cast<CompletionOpcode>(wc.opcode);
        c.byteLen = wc.byte_len;
        c.hasImm = (wc.wc_flags & IBV_WC_WITH_IMM) != 0;
        c.imm = c.hasImm ? be32toh(wc.imm_data) : 0;
      }
      total += n;
      if (n < want) break;
    }
    return total;
  }

  // What the device made, which may exceed what was asked.
  int capacity() const override { return cq_->cqe; }
  ibv_cq* get() const { return cq_.get(); }
  const std::shared_ptr<ibv_cq>& shared() const { return cq_; }

 private:
  Library lib_;
  std::shared_ptr<ibv_comp_channel> channel_;  // destroyed after the queue
  std::shared_ptr<ibv_cq> cq_;
  unsigned int unacknowledged_ = 0;
};

class VerbsQueuePair final : public QueuePair {
 public:
  VerbsQueuePair(Library lib, std::shared_ptr<ibv_pd> pd, std::shared_ptr<ibv_cq> sendCq,
                 std::shared_ptr<ibv_cq> recvCq, ibv_qp* qp)
      : lib_(std::move(lib)),
        pd_(std::move(pd)),
        sendCq_(std::move(sendCq)),
        recvCq_(std::move(recvCq)),
        qp_(qp) {}
  ~VerbsQueuePair() override { lib_->destroyQp(qp_); }

  uint32_t qpn() const override { return qp_->qp_num; }

  QueuePairState state() const override {
    if (!lib_->queryQp) return state_;
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    if (lib_->queryQp(qp_, &attr, IBV_QP_STATE, &init) != 0) return state_;
    switch (attr.qp_state) {
      case IBV_QPS_RESET:
      case IBV_QPS_INIT:
      case IBV_QPS_RTR:
      case IBV_QPS_RTS:
      case IBV_QPS_ERR:
        return static_cast<QueuePairState>(attr.qp_state);
      default:
        // braid never drains a queue pair, so the other states (SQD, SQE)
        // mean its send queue has failed.
        return QueuePairState::kError;
    }
  }

  Status toInit(uint8_t port, AccessFlags access) override {
    if (state_ != QueuePairState::kReset)
      return refuseTransition(qpn(), state_, QueuePairState::kInit);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = port;
    attr.qp_access_flags = static_cast<unsigned>(accessBits(access));
    BRAID_RETURN_IF_ERROR(
        modify(attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
               QueuePairState::kInit));
    port_ = port;
    return Status::ok();
  }

  Status toReadyToReceive(const QueuePairAddress& remote, Mtu mtu) override {
    if (state_ != QueuePairState::kInit)
      return refuseTransition(qpn(), state_, QueuePairState::kReadyToReceive);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = static_cast<ibv_mtu>(mtu);
    attr.dest_qp_num = remote.qpn;
    attr.rq_psn = remote.psn & kPsnMask;
    // Writes need no read or atomic resources, but verbs wants a value.
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = kMinRnrTimer;
    attr.ah_attr.dlid = remote.lid;
    attr.ah_attr.sl = 0;
    attr.ah_attr.src_path_bits = 0;
    attr.ah_attr.port_num = port_;
    // RoCE always routes by GID; InfiniBand inside one subnet by LID.
    if (!remote.gid.isZero()) {
      if (remote.gidIndex < 0 || remote.gidIndex > 255)
        return invalidArgument(strCat("queue pair ", qpn(), ": GID index ", remote.gidIndex));
      attr.ah_attr.is_global = 1;
      std::memcpy(attr.ah_attr.grh.dgid.raw, remote.gid.raw.data(), remote.gid.raw.size());
      attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(remote.gidIndex);
      attr.ah_attr.grh.hop_limit = kHopLimit;
      attr.ah_attr.grh.traffic_class = 0;
      attr.ah_attr.grh.flow_label = 0;
    }
    return modify(attr,
                  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                  QueuePairState::kReadyToReceive);
  }

  Status toReadyToSend(uint32_t psn, uint8_t timeout, uint8_t retryCount,
                       uint8_t rnrRetry) override {
    if (state_ != QueuePairState::kReadyToReceive)
      return refuseTransition(qpn(), state_, QueuePairState::kReadyToSend);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = psn & kPsnMask;
    attr.timeout = timeout;
    attr.retry_cnt = retryCount;
    attr.rnr_retry = rnrRetry;
    attr.max_rd_atomic = 1;
    return modify(attr,
                  IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                      IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
                  QueuePairState::kReadyToSend);
  }

  Status postRecv(uint64_t wrId, const LocalBuffer& buffer) override {
    if (state_ == QueuePairState::kReset)
      return invalidUsage(strCat("queue pair ", qpn(),
                                 ": cannot post a receive in state RESET; receives need INIT"));
    ibv_sge sge = toSge(buffer);
    ibv_recv_wr wr{};
    wr.wr_id = wrId;
    wr.sg_list = buffer.bytes > 0 ? &sge : nullptr;
    wr.num_sge = buffer.bytes > 0 ? 1 : 0;
    ibv_recv_wr* bad = nullptr;
    if (int rc = ibv_post_recv(qp_, &wr, &bad); rc != 0)
      return errnoStatus(strCat("ibv_post_recv on queue pair ", qpn()), rc);
    return Status::ok();
  }

  Status postWriteWithImm(uint64_t wrId, const LocalBuffer& local, const RemoteBuffer& remote,
                          uint32_t imm, bool signaled) override {
    return postSend(wrId, local, remote, IBV_WR_RDMA_WRITE_WITH_IMM, imm, signaled);
  }

  Status postWrite(uint64_t wrId, const LocalBuffer& local, const RemoteBuffer& remote,
                   bool signaled) override {
    return postSend(wrId, local, remote, IBV_WR_RDMA_WRITE, 0, signaled);
  }

  Status postRead(uint64_t wrId, const LocalBuffer& local, const RemoteBuffer& remote,
                  bool signaled) override {
    return postSend(wrId, local, remote, IBV_WR_RDMA_READ, 0, signaled);
  }

 private:
  static ibv_sge toSge(const LocalBuffer& buffer) {
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(buffer.addr);
    sge.length = buffer.bytes;
    sge.lkey = buffer.lkey;
    return sge;
  }

  Status modify(ibv_qp_attr& attr, int mask, QueuePairState to) {
    if (int rc = lib_->modifyQp(qp_, &attr, mask); rc != 0)
      return errnoStatus(strCat("queue pair ", qpn(), ": ", queuePairStateName(state_), " -> ",
                                queuePairStateName(to), " (ibv_modify_qp)"),
                         rc);
    state_ = to;
    return Status::ok();
  }

  Status postSend(uint64_t wrId, const LocalBuffer& local, const RemoteBuffer& remote,
                  ibv_wr_opcode opcode, uint32_t imm, bool signaled) {
    // A queue pair the device moved to ERROR still takes posts (they are
    // flushed); the states below RTS are refused as the model refuses them.
    if (state_ != QueuePairState::kReadyToSend)
      return invalidUsage(strCat("queue pair ", qpn(), ": cannot post a write in state ",
                                 queuePairStateName(state_), "; sends need RTS"));
    ibv_sge sge = toSge(local);
    ibv_send_wr wr{};
    wr.wr_id = wrId;
    wr.sg_list = local.bytes > 0 ? &sge : nullptr;
    wr.num_sge = local.bytes > 0 ? 1 : 0;
    wr.opcode = opcode;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM) wr.imm_data = htobe32(imm);
    wr.wr.rdma.remote_addr = remote.addr;
    wr.wr.rdma.rkey = remote.rkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(qp_, &wr, &bad); rc != 0)
      return errnoStatus(strCat("ibv_post_send on queue pair ", qpn()), rc);
    return Status::ok();
  }

  Library lib_;
  // Kept until the queue pair is destroyed: verbs refuses to destroy a
  // protection domain or a completion queue that a queue pair still uses.
  std::shared_ptr<ibv_pd> pd_;
  std::shared_ptr<ibv_cq> sendCq_;
  std::shared_ptr<ibv_cq> recvCq_;
  ibv_qp* qp_;
  // Transitions are made only through this object, so the state it set
  // is the state, unless the device failed the queue pair since.
  QueuePairState state_ = QueuePairState::kReset;
  uint8_t port_ = 0;
};

class VerbsProtectionDomain final : public ProtectionDomain {
 public:
  VerbsProtectionDomain(Library lib, std::shared_ptr<ibv_context> context,
                        std::shared_ptr<ibv_pd> pd)
      : lib_(std::move(lib)), context_(std::move(context)), pd_(std::move(pd)) {}

  Result<std::unique_ptr<MemoryRegion>> registerMemory(void* addr, size_t bytes,
                                                       AccessFlags access) override {
    errno = 0;
    ibv_mr* mr = lib_->regMr(pd_.get(), addr, bytes, accessBits(access));
    if (!mr) {
      const int err = errno;
      return failedCall(strCat("ibv_reg_mr of ", bytes, " bytes at ", addr), err);
    }
    return std::unique_ptr<MemoryRegion>(new VerbsMemoryRegion(lib_, pd_, mr));
  }

  Result<std::unique_ptr<QueuePair>> createQueuePair(CompletionQueue& sendCq,
                                                     CompletionQueue& recvCq,
                                                     QueuePairCapacity capacity) override {
    auto* send = dynamic_cast<VerbsCompletionQueue*>(&sendCq);
    auto* recv = dynamic_cast<VerbsCompletionQueue*>(&recvCq);
    if (!send || !recv) return invalidArgument("completion queues of another verbs implementation");
    ibv_qp_init_attr init{};
    init.send_cq = send->get();
    init.recv_cq = recv->get();
    init.cap.max_send_wr = capacity.maxSendWr;
    init.cap.max_recv_wr = capacity.maxRecvWr;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = 0;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;
    errno = 0;
    ibv_qp* qp = lib_->createQp(pd_.get(), &init);
    if (!qp) {
      const int err = errno;
      return failedCall(strCat("ibv_create_qp (", capacity.maxSendWr, " sends, ",
                               capacity.maxRecvWr, " receives)"),
                        err);
    }
    return std::unique_ptr<QueuePair>(
        new VerbsQueuePair(lib_, pd_, send->shared(), recv->shared(), qp));
  }

 private:
  Library lib_;
  std::shared_ptr<ibv_context> context_;
  std::shared_ptr<ibv_pd> pd_;
};

class VerbsDevice final : public Device {
 public:
  VerbsDevice(Library lib, std::shared_ptr<ibv_context> context, std::string name)
      : lib_(std::move(lib)), context_(std::move(context)), name_(std::move(name)) {}

  const std::string& name() const override { return name_; }

  Result<PortInfo> queryPort(uint8_t port) override {
    ibv_port_attr attr{};
    if (int rc = lib_->queryPort(context_.get(), port, &attr); rc != 0)
      return errnoStatus(strCat(name_, " port ", int{port}, ": ibv_query_port"), rc);
    PortInfo info;
    info.state = static_cast<PortState>(attr.state);
    // Drivers from before RoCE report 0 (unspecified) for InfiniBand.
    info.linkLayer =
        attr.link_layer == IBV_LINK_LAYER_ETHERNET ? LinkLayer::kEthernet : LinkLayer::kInfiniBand;
    info.lid = attr.lid;
    info.gidTableLength = attr.gid_tbl_len;
    info.activeMtu = static_cast<Mtu>(attr.active_mtu);
    return info;
  }

  Result<Gid> queryGid(uint8_t port, int index) override {
    ibv_gid raw{};
    errno = 0;
    if (int rc = lib_->queryGid(context_.get(), port, index, &raw); rc != 0) {
      // Older providers return -1 and set errno, newer ones the errno value.
      const int err = rc < 0 ? errno : rc;
      return failedCall(strCat(name_, " port ", int{port}, " GID ", index, ": ibv_query_gid"), err);
    }
    Gid gid;
    std::memcpy(gid.raw.data(), raw.raw, gid.raw.size());
    return gid;
  }

  Result<std::unique_ptr<ProtectionDomain>> allocProtectionDomain() override {
    errno = 0;
    ibv_pd* pd = lib_->allocPd(context_.get());
    if (!pd) {
      const int err = errno;
      return failedCall(strCat(name_, ": ibv_alloc_pd"), err);
    }
    // The deleter keeps the device open until the domain is gone.
    std::shared_ptr<ibv_pd> shared(
        pd, [lib = lib_, context = context_](ibv_pd* p) { lib->deallocPd(p); });
    return std::unique_ptr<ProtectionDomain>(
        new VerbsProtectionDomain(lib_, context_, std::move(shared)));
  }

  Result<std::unique_ptr<CompletionQueue>> createCompletionQueue(int entries) override {
    errno = 0;
    ibv_comp_channel* channel = lib_->createCompChannel(context_.get());
    if (!channel) {
      const int err = errno;
      return failedCall(strCat(name_, ": ibv_create_comp_channel"), err);
    }
    std::shared_ptr<ibv_comp_channel> sharedChannel(
        channel,
        [lib = lib_, context = context_](ibv_comp_channel* c) { lib->destroyCompChannel(c); });
    const int flags = ::fcntl(channel->fd, F_GETFL);
    if (flags < 0 || ::fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) < 0)
      return failedCall(strCat(name_, ": making the completion channel nonblocking"), errno);
    errno = 0;
    ibv_cq* cq = lib_->createCq(context_.get(), entries, nullptr, channel, 0);
    if (!cq) {
      const int err = errno;
      return failedCall(strCat(name_, ": ibv_create_cq of ", entries, " entries"), err);
    }
    // The channel outlives the queue: the deleter holds it.
    std::shared_ptr<ibv_cq> shared(
        cq, [lib = lib_, context = context_, sharedChannel](ibv_cq* c) { lib->destroyCq(c); });
    return std::unique_ptr<CompletionQueue>(
        new VerbsCompletionQueue(lib_, std::move(sharedChannel), std::move(shared)));
  }

 private:
  Library lib_;
  std::shared_ptr<ibv_context> context_;
  std::string name_;
};

}  // namespace

Result<std::unique_ptr<Device>> openVerbsDevice(std::shared_ptr<const VerbsLibrary> library,
                                                const std::string& name) {
  if (!library) return invalidArgument("openVerbsDevice without a library");
  const VerbsLibrary& lib = *library;
  int count = 0;
  errno = 0;
  VerbsLibrary::DeviceList list = lib.deviceList(&count);
  if (!list) {
    const int err = errno;
    return failedCall("ibv_get_device_list", err);
  }
  std::string names;
  for (int i = 0; i < count; ++i) {
    const char* deviceName = lib.getDeviceName(list.get()[i]);
    const std::string found = deviceName ? deviceName : "";
    if (!name.empty() && found != name) {
      names += strCat(names.empty() ? "" : ", ", found);
      continue;
    }
    errno = 0;
    ibv_context* context = lib.openDevice(list.get()[i]);
    if (!context) {
      const int err = errno;
      return failedCall(strCat("ibv_open_device ", found), err);
    }
    // The context no longer needs the list; the library stays loaded for
    // as long as anything made from the device is alive.
    std::shared_ptr<ibv_context> shared(context,
                                        [library](ibv_context* c) { library->closeDevice(c); });
    return std::unique_ptr<Device>(new VerbsDevice(library, std::move(shared), found));
  }
  if (count == 0) return notSupported("no RDMA devices");
  return invalidArgument(strCat("no RDMA device \"", name, "\" (there are ", names, ")"));
}

}  // namespace braid::ib
