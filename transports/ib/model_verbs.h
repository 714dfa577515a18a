// An in-process software model of the verbs in verbs.h, so that the
// InfiniBand transport and its conformance suite run where there is no
// RDMA (this machine's kernel has none). It keeps the semantics a
// transport depends on, and fails where hardware would:
//
// - One process-wide fabric, guarded by one mutex, so ranks on different
//   threads of one test process can talk. It starts with devices "model0"
//   and "model1", each with port 1 on Ethernet (RoCE: GID 0 link-local,
//   GID 1 IPv4-mapped) and port 2 on InfiniBand (LID 1 + device index).
//   A path is routed by the peer's GID, or by its LID when the GID is zero
//   (InfiniBand without a global route header), then by queue pair number.
// - Queue pairs move RESET -> INIT -> RTR -> RTS only; a send needs RTS, a
//   receive INIT or later. In ERROR, posts are accepted and complete with
//   kWorkRequestFlushError, as in verbs.
// - A write executes when it is posted, on the poster's thread, under the
//   fabric lock: the bytes are at the target before postWrite* returns and
//   the completions are queued then. (Hardware is asynchronous; a transport
//   that waits for its completions cannot tell the difference, and an
//   immediate, deterministic model makes failures reproducible.)
// - Checks, in the order a responder makes them: the local key and range
//   (else kLocalProtectionError); a reachable peer in RTR or RTS whose
//   remote side names this queue pair and whose expected PSN matches (else
//   kRetryExceeded: hardware would resend until its retry count ran out);
//   the remote key, its protection domain, remote-write access on both the
//   region and the peer queue pair, and the range (else
//   kRemoteAccessError). A failed write completes with its error even when
//   unsignaled, the sender goes to ERROR and its later work requests are
//   flushed. The target is left as it was.
// - A write with immediate consumes the oldest receive posted at the
//   target. With none posted (receiver not ready), the write and every
//   later one of its queue pair wait, in order, as hardware resending after
//   RNR NAKs would: with rnrRetry 7 (retry without end, what the transport
//   uses) until the target posts a receive, which runs them at once; with
//   rnrRetry 0 it fails at once; with 1..6, each poll of the sender's send
//   queue counts as one retry and the write fails with kRnrRetryExceeded
//   after rnrRetry of them. Polls stand in for the RNR timer so that the
//   outcome does not depend on timing.
// - A completion queue that receives a completion with all its entries
//   full is overrun: every later poll fails, as hardware raises a CQ error
//   and the queue is lost. Nothing is dropped silently.
// - Send-queue slots are released as verbs releases them (see QueuePair in
//   verbs.h); posting past maxSendWr or maxRecvWr fails, like ENOMEM.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transports/ib/verbs.h"

namespace braid::ib {

struct ModelPortSpec {
  PortState state = PortState::kActive;
  LinkLayer linkLayer = LinkLayer::kEthernet;
  uint16_t lid = 0;
  Mtu activeMtu = Mtu::k4096;
  std::vector<Gid> gids;
};

struct ModelDeviceSpec {
  std::string name;
  std::vector<ModelPortSpec> ports;  // port 1 first
};

// Adds a device to the fabric for the life of the process; refuses a name
// already there, or a GID another port has.
Status addModelDevice(const ModelDeviceSpec& spec);

// The named model device, or the first one when `name` is empty.
Result<std::unique_ptr<Device>> openModelDevice(const std::string& name = "");

}  // namespace braid::ib
