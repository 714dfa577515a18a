// The progress engine: runs the Schedules of one or more calls to completion
// by posting each step once the steps it waits for are done, driving the
// connections, and waiting in poll(2) when nothing can move. It is the only
// code that knows about tags, deadlines and aborts; the algorithms only
// describe steps and the transports only move bytes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "algorithms/schedule.h"
#include "src/call_signature.h"
#include "src/common/datatype.h"
#include "src/common/status.h"
#include "transports/cuda_ipc/ipc_device.h"
#include "transports/transport.h"

namespace braid {

// What running a schedule needs besides its steps, derived from them once
// and kept with a cached plan, so that a repeated call allocates nothing
// for it: how many steps each step waits for, which steps wait for it, and
// each transfer's index among the call's messages with its peer.
struct ScheduleIndex {
  std::vector<int32_t> waiting;          // unfinished dependencies of each step
  std::vector<int> ready;                // the steps that wait for none, last first
  std::vector<int32_t> dependentsBegin;  // step i's dependents: dependents[begin[i], begin[i+1])
  std::vector<int32_t> dependents;
  std::vector<uint32_t> messageIndex;  // k of the send or receive with its peer
};
ScheduleIndex indexSchedule(const algo::Schedule& schedule);

// A job whose buffers live on a GPU: its local steps are queued on the
// device's work queue, which its connections (cuda_ipc) also use, so every
// step is ordered after the ones it waits for without the host waiting.
// The functions are the device's reductions (Combiner::applyOnDevice), null
// on a device that runs the host's (the tests' stand-in).
struct DeviceWork {
  transport::cuda_ipc::IpcDevice* device = nullptr;  // null: host memory
  decltype(transport::Combiner::applyOnDevice) reduce = nullptr;
  decltype(transport::Combiner::applyOnDevice) reduceIncomingFirst = nullptr;
  // dst = local / nranks (incoming unused).
  decltype(transport::Combiner::applyOnDevice) average = nullptr;
};

// One call's share of a run: its schedule bound to memory and connections.
struct Job {
  const algo::Schedule* schedule = nullptr;
  const ScheduleIndex* index = nullptr;  // of `schedule`; null = derived when run
  uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
  uint8_t* scratch = nullptr;
  DataType dtype = DataType::kFloat32;
  RedOp op = RedOp::kSum;
  int nranks = 1;
  int rank = 0;
  // connections[peer]; the own rank's entry is a loopback connection.
  std::span<transport::Connection* const> connections;
  // Tag of the k-th message to or from `peer` in this call.
  std::function<transport::Tag(bool isSend, int peer, uint32_t k)> tagFor;
  // A collective's messages all have tags before this in their channel
  // (its top byte; src/call_tags.h); anything unclaimed before it when the
  // call is done was sent by a peer that made a different call. 0 = no
  // such check.
  uint64_t tagsBelow = 0;
  // Jobs with the same non-null key run one after another, in order (the
  // collectives of one group on one communicator: tags on a connection must
  // rise within a channel). Jobs with different keys run concurrently.
  const void* serialKey = nullptr;
  std::string callName;         // for messages: "braidAllReduce #12"
  double timeoutSeconds = 300;  // no progress for this long = braidTimeout
  double spinSeconds = 0;       // busy-poll this long before sleeping in poll(2)
  // Of which this long without yielding the core: only worth it when every
  // rank of the host has a core of its own.
  double pureSpinSeconds = 0;
  const std::atomic<bool>* aborted = nullptr;
  int abortFd = -1;  // becomes readable on abort; wakes poll(2)
  // Set when send, recv and scratch are GPU memory: connections[peer] then
  // move GPU memory too. runJobs returns once the device ran the job's work.
  DeviceWork gpu;
  // Asked while the job makes no progress (every 200 ms or so after the
  // first 200 ms): a failure fails the job at once, as a peer known to have
  // made another call will never send what the job waits for. May be empty.
  std::function<Status(const Job&)> stallCheck;
};

// Runs every job to completion (all together, so that the calls of a group
// cannot deadlock on each other). On failure, the connections a failed job
// still had requests on are aborted: no late message can land in memory the
// caller has taken back. Returns the first failure.
Status runJobs(std::span<Job> jobs);

// What the peers of a failed job are told. A call that failed because its
// own rank aborted the communicator fails there as misuse (the caller
// aborted it), but for the peers it is a rank that went away: they must
// see braidRemoteError naming it, whichever of the aborting thread and the
// call's own thread reaches the connections first. Any other failure (a
// mismatch, a timeout, a lost peer) is passed on as it is.
Status reasonForPeers(const Job& job, const Status& failure);

}  // namespace braid
