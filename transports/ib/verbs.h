// The verbs an InfiniBand/RoCE reliable-connected transport needs, as a
// small interface with two implementations: real libibverbs (real_verbs.h)
// and an in-process software model (model_verbs.h), so that one transport
// and one conformance suite run on both. It does not include
// <infiniband/verbs.h>: the transport and its tests build without
// libibverbs-dev. Enumerator values mirror verbs, so the real adapter maps
// by value.
//
// Ownership: every object releases its verbs resource in its destructor.
// Children keep what they were made from alive (a memory region its
// protection domain, a queue pair its completion queues), so destruction
// order cannot make verbs refuse a destroy with EBUSY.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "src/common/status.h"

namespace braid::ib {

enum class PortState : uint8_t { kDown = 1, kInit = 2, kArmed = 3, kActive = 4, kActiveDefer = 5 };
enum class LinkLayer : uint8_t { kInfiniBand = 1, kEthernet = 2 };
enum class Mtu : uint8_t { k256 = 1, k512 = 2, k1024 = 3, k2048 = 4, k4096 = 5 };

int mtuBytes(Mtu mtu);

struct PortInfo {
  PortState state = PortState::kDown;
  LinkLayer linkLayer = LinkLayer::kInfiniBand;
  uint16_t lid = 0;  // routes on InfiniBand; zero on Ethernet, where the GID routes
  int gidTableLength = 0;
  Mtu activeMtu = Mtu::k1024;  // the largest path MTU toReadyToReceive may ask for
  bool active() const { return state == PortState::kActive; }
};

struct Gid {
  std::array<uint8_t, 16> raw{};
  bool isZero() const;
  friend bool operator==(const Gid&, const Gid&) = default;
};

std::string toString(const Gid& gid);  // "fe80:0000:...:0001", for messages and logs

struct AccessFlags {
  bool localWrite = false;
  bool remoteWrite = false;  // verbs requires localWrite with it
  bool remoteRead = false;
};

// Mirrors enum ibv_wc_status value for value.
enum class CompletionStatus : int {
  kSuccess = 0,
  kLocalLengthError = 1,
  kLocalQpOperationError = 2,
  kLocalEecOperationError = 3,
  kLocalProtectionError = 4,
  kWorkRequestFlushError = 5,
  kMemoryWindowBindError = 6,
  kBadResponseError = 7,
  kLocalAccessError = 8,
  kRemoteInvalidRequestError = 9,
  kRemoteAccessError = 10,
  kRemoteOperationError = 11,
  kRetryExceeded = 12,
  kRnrRetryExceeded = 13,
  kLocalRddViolationError = 14,
  kRemoteInvalidRdRequest = 15,
  kRemoteAbortError = 16,
  kInvalidEecn = 17,
  kInvalidEecState = 18,
  kFatalError = 19,
  kResponseTimeoutError = 20,
  kGeneralError = 21,
};

// The text libibverbs' ibv_wc_status_str gives, so logs read the same on
// the model and on hardware.
const char* completionStatusName(CompletionStatus status);

// Mirrors the ibv_wc_opcode values braid can see. A write with immediate
// completes as kRdmaWrite at the sender.
enum class CompletionOpcode : int {
  kSend = 0,
  kRdmaWrite = 1,
  kRdmaRead = 2,
  kRecv = 128,
  kRecvRdmaWithImm = 129,
};

// As in verbs, only wrId and status are defined when status is not
// kSuccess.
struct Completion {
  uint64_t wrId = 0;
  CompletionStatus status = CompletionStatus::kSuccess;
  CompletionOpcode opcode = CompletionOpcode::kSend;
  uint32_t byteLen = 0;
  uint32_t imm = 0;  // host byte order
  bool hasImm = false;
  bool ok() const { return status == CompletionStatus::kSuccess; }
};

class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* addr() const { return addr_; }
  size_t length() const { return length_; }
  uint32_t lkey() const { return lkey_; }
  uint32_t rkey() const { return rkey_; }  // what a peer needs to write here

 protected:
  MemoryRegion(void* addr, size_t length, uint32_t lkey, uint32_t rkey)
      : addr_(addr), length_(length), lkey_(lkey), rkey_(rkey) {}

 private:
  void* addr_;
  size_t length_;
  uint32_t lkey_;
  uint32_t rkey_;
};

class CompletionQueue {
 public:
  virtual ~CompletionQueue() = default;
  // Up to out.size() completions, oldest first; 0 when none. An error is
  // the queue itself failing (an overrun), after which it is unusable.
  virtual Result<int> poll(std::span<Completion> out) = 0;
  virtual int capacity() const = 0;

  // Sleeping on the queue (a completion channel in verbs): after armWake(),
  // wakeFd() becomes readable once a completion is added. A completion
  // that came before armWake() does not wake it, so a caller arms, polls
  // once more, and sleeps only if that found nothing; after a wake-up it
  // calls consumeWake() before arming again.
  virtual int wakeFd() const = 0;
  virtual Status armWake() = 0;
  virtual void consumeWake() = 0;
};

enum class QueuePairState : uint8_t {
  kReset = 0,
  kInit = 1,
  kReadyToReceive = 2,
  kReadyToSend = 3,
  kError = 6,
};

const char* queuePairStateName(QueuePairState state);  // "RESET", "INIT", "RTR", "RTS", "ERROR"

// The refusal of an out-of-order transition, worded alike by every
// implementation (verbs itself would only say EINVAL).
Status refuseTransition(uint32_t qpn, QueuePairState from, QueuePairState to);

// What a side publishes so its peer can connect to it.
struct QueuePairAddress {
  uint32_t qpn = 0;
  uint32_t psn = 0;  // 24 bits: the first packet sequence number it sends
  uint16_t lid = 0;
  Gid gid;
  // The local GID index the path is sent from (ah_attr.grh.sgid_index):
  // the one field of the address passed to toReadyToReceive that is this
  // side's own, not the peer's. Both sides of a RoCE path must use GIDs of
  // one type (v1/v2, IPv4/IPv6), which is why peers also exchange it.
  int gidIndex = 0;
};

struct LocalBuffer {
  void* addr = nullptr;
  uint32_t bytes = 0;  // zero: no scatter entry, no key checked
  uint32_t lkey = 0;
};

struct RemoteBuffer {
  uint64_t addr = 0;
  uint32_t rkey = 0;
};

struct QueuePairCapacity {
  uint32_t maxSendWr = 0;
  uint32_t maxRecvWr = 0;
};

// Reliable connected. Posting never blocks. As in verbs, a send work
// request holds its send-queue slot until its completion is polled, and an
// unsignaled one until a later signaled completion of the same queue pair
// is polled: a transport must signal now and then, and post at most
// maxSendWr past the last signaled completion it polled.
class QueuePair {
 public:
  virtual ~QueuePair() = default;

  virtual uint32_t qpn() const = 0;
  virtual QueuePairState state() const = 0;

  virtual Status toInit(uint8_t port, AccessFlags access) = 0;
  virtual Status toReadyToReceive(const QueuePairAddress& remote, Mtu mtu) = 0;
  // timeout: 4.096 us * 2^timeout per attempt; retryCount, rnrRetry: 0..7,
  // rnrRetry 7 retrying without end while the peer has no receive posted.
  virtual Status toReadyToSend(uint32_t psn, uint8_t timeout, uint8_t retryCount,
                               uint8_t rnrRetry) = 0;

  // A receive for a write with immediate needs no buffer: the data lands
  // where the writer put it; the receive carries only the immediate.
  virtual Status postRecv(uint64_t wrId, const LocalBuffer& buffer = {}) = 0;
  virtual Status postWriteWithImm(uint64_t wrId, const LocalBuffer& local,
                                  const RemoteBuffer& remote, uint32_t imm, bool signaled) = 0;
  virtual Status postWrite(uint64_t wrId, const LocalBuffer& local, const RemoteBuffer& remote,
                           bool signaled) = 0;
  // Copies the peer's `remote` into `local`, which must be registered with
  // local write; the peer's region and queue pair need remote read.
  virtual Status postRead(uint64_t wrId, const LocalBuffer& local, const RemoteBuffer& remote,
                          bool signaled) = 0;
};

class ProtectionDomain {
 public:
  virtual ~ProtectionDomain() = default;
  virtual Result<std::unique_ptr<MemoryRegion>> registerMemory(void* addr, size_t bytes,
                                                               AccessFlags access) = 0;
  // Both queues must come from the same device as this domain.
  virtual Result<std::unique_ptr<QueuePair>> createQueuePair(CompletionQueue& sendCq,
                                                             CompletionQueue& recvCq,
                                                             QueuePairCapacity capacity) = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual const std::string& name() const = 0;
  virtual Result<PortInfo> queryPort(uint8_t port) = 0;  // ports count from 1
  virtual Result<Gid> queryGid(uint8_t port, int index) = 0;
  virtual Result<std::unique_ptr<ProtectionDomain>> allocProtectionDomain() = 0;
  virtual Result<std::unique_ptr<CompletionQueue>> createCompletionQueue(int entries) = 0;
};

}  // namespace braid::ib
