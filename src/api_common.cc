// The ABI edge's shared parts: last-error storage, result mapping, handle
// checks, and group calls (per thread, nestable).
#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "src/common/log.h"
#include "src/common/strcat.h"
#include "src/device_staging.h"
#include "src/handles.h"

namespace braid::api {

namespace {
thread_local std::string lastError;

struct PendingOperation {
  braidComm* handle;  // counts braidGroupEnd as a call in flight on it
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<HostStream> stream;  // null: run by braidGroupEnd
  Operation op;
  GpuPlacement gpu;  // buffers staged around the group
  // Set where `stream` is ordered on a CUDA stream (braidStreamCreateFromCuda).
  std::shared_ptr<CudaStreamBridge> cuda;
};
thread_local int groupDepth = 0;
thread_local std::vector<PendingOperation> groupOps;
// The first call of the open group that was refused; the group then runs
// none of its calls.
thread_local std::optional<Status> groupRefusal;
}  // namespace

void setLastError(const std::string& message) {
  lastError = message;
}
const std::string& lastErrorMessage() {
  return lastError;
}

braidResult_t toResult(const Status& s, const char* call) {
  if (s.isOk() || s.code() == ErrorCode::kInProgress) return static_cast<braidResult_t>(s.code());
  std::string message =
      s.message().starts_with(call) ? s.message() : strCat(call, ": ", s.message());
  setLastError(message);
  BRAID_INFO("error ", static_cast<int>(s.code()), ": ", message);
  return static_cast<braidResult_t>(s.code());
}

Status checkComm(braidComm_t comm) {
  if (comm == nullptr) return invalidArgument("comm is NULL");
  if (comm->magic != braidComm::kMagic || !comm->comm)
    return invalidArgument("comm is not a live communicator (destroyed?)");
  if (comm->comm->aborted()) return invalidUsage("communicator aborted");
  return Status::ok();
}

Status checkStream(braidStream_t stream) {
  if (stream == nullptr) return invalidArgument("stream is NULL");
  if (stream->magic != braidStream::kMagic || !stream->stream)
    return invalidArgument("stream is not a live stream (destroyed?)");
  return Status::ok();
}

bool groupOpen() {
  return groupDepth > 0;
}

Status notedInGroup(const char* call, Status s) {
  if (groupDepth > 0 && !s.isOk() && !groupRefusal) groupRefusal = s.withContext(call);
  return s;
}

Status submit(braidComm_t comm, braidStream_t stream, std::vector<Operation> ops) {
  if (stream) {
    BRAID_RETURN_IF_ERROR(checkStream(stream));
    if (&stream->stream->communicator() != comm->comm.get())
      return invalidArgument("stream belongs to another communicator");
  }
  if (groupDepth > 0) {
    for (auto& op : ops)
      groupOps.push_back({comm, comm->comm, stream ? stream->stream : nullptr, std::move(op)});
    return Status::ok();
  }
  if (stream) {
    stream->stream->enqueue(std::move(ops));
    return Status::ok();
  }
  return comm->comm->run(ops, 0);
}

Status submitStagedToGroup(braidComm_t comm, braidStream_t stream, Operation op,
                           const GpuPlacement& placement) {
  if (groupDepth == 0) return internalError("no group is open");
  if (stream) {
    BRAID_RETURN_IF_ERROR(checkStream(stream));
    if (&stream->stream->communicator() != comm->comm.get())
      return invalidArgument("stream belongs to another communicator");
  }
  groupOps.push_back({comm, comm->comm, stream ? stream->stream : nullptr, std::move(op), placement,
                      stream ? stream->cuda : nullptr});
  return Status::ok();
}

namespace {

bool onGpu(const GpuPlacement& g) {
  return g.sendOnGpu || g.recvOnGpu;
}

// Readies `op`'s GPU buffers (`g` says which) for its run with `copies`: a
// GPU job's once the work queued before it on their GPU is done; others
// staged, `op` pointed at the host copies, which `staged` keeps.
Status stageInto(Operation& op, const GpuPlacement& g, GpuCopies& copies,
                 std::vector<StagedBuffers>& staged) {
  if (!onGpu(g)) return Status::ok();
  if (op.gpuOrdinal >= 0)
    return copies.awaitEarlierWork(g.sendOnGpu ? op.send : op.recv, "waiting for the GPU");
  BRAID_ASSIGN_OR_RETURN(
      StagedBuffers s, StagedBuffers::stage(op.send, g.sendBytes, g.sendOnGpu, op.recv, g.recvBytes,
                                            g.recvOnGpu, copies));
  op.send = s.send();
  op.recv = s.recv();
  staged.push_back(std::move(s));
  return Status::ok();
}

// Readies the GPU buffers of `ops` (placements[i] says which) with `copies`
// (stageInto), runs them as one batch on `host`, and copies the staged
// results back.
Status runStagedBatch(HostStream& host, std::vector<Operation> ops,
                      const std::vector<GpuPlacement>& placements, GpuCopies& copies) {
  std::vector<StagedBuffers> staged;
  for (size_t i = 0; i < ops.size(); ++i)
    BRAID_RETURN_IF_ERROR(stageInto(ops[i], placements[i], copies, staged));
  BRAID_RETURN_IF_ERROR(host.communicator().run(ops, host.index()));
  for (StagedBuffers& s : staged) BRAID_RETURN_IF_ERROR(s.finish());
  return Status::ok();
}

// Queues a group's calls on one braid stream as one task: on a CUDA
// stream, held at this point (braidGroupEnd) until the task ran, they run
// once the CUDA stream reaches it, staging with the bridge's copies; on a
// host stream, after the calls queued before, staging after the work on
// their GPUs.
// `gate` is the CUDA stream's hold, taken by the caller (with `cuda`).
void enqueueStagedBatch(std::shared_ptr<HostStream> host, std::shared_ptr<CudaStreamBridge> cuda,
                        std::optional<CudaStreamBridge::Gate> gate, std::vector<Operation> ops,
                        std::vector<GpuPlacement> placements) {
  HostStream* stream = host.get();  // outlives its queued tasks
  stream->enqueueTask([cuda, gate, ops = std::move(ops), placements = std::move(placements),
                       stream](const Status& earlier) -> Status {
    // After a failure too: the CUDA stream must not hang.
    std::optional<CudaStreamBridge::ReleaseAtExit> release;
    if (cuda) release.emplace(*cuda, *gate);
    Status outcome = Status::ok();
    if (earlier.isOk()) {
      if (cuda)
        outcome = cuda->awaitReached(*gate, stream->communicator().timeout(),
                                     stream->communicator().abortedFlag());
      if (outcome.isOk())
        outcome = runStagedBatch(*stream, ops, placements,
                                 cuda ? static_cast<GpuCopies&>(*cuda) : contextOrderedCopies());
    }
    return outcome;
  });
}

// Holds the CUDA stream of every batch that has one (the batches' `cuda`;
// each receives its `gate`), all or none: a refusal (a stream that
// captures a graph) must leave the whole group unrun. A hold already taken
// is let go by a task of its own braid stream, after the calls queued there
// before it, as a CUDA stream's holds are released in the order taken.
// `batches` are in the order of the group's calls, the same on every rank:
// braid streams made from one CUDA stream take their holds on it in that
// order, and a call held behind another's hold on one rank is held behind it
// on every rank.
template <typename Batch>
Status holdEveryCudaStream(const std::vector<std::pair<HostStream*, Batch*>>& batches) {
  for (size_t i = 0; i < batches.size(); ++i) {
    Batch& batch = *batches[i].second;
    if (!batch.cuda) continue;
    Result<CudaStreamBridge::Gate> gate = batch.cuda->hold();
    if (gate.isOk()) {
      batch.gate = *gate;
      continue;
    }
    for (size_t taken = 0; taken < i; ++taken)
      if (const Batch& held = *batches[taken].second; held.gate)
        batches[taken].first->enqueueTask([cuda = held.cuda, gate = *held.gate](const Status&) {
          cuda->release(gate);
          return Status::ok();
        });
    return gate.status();
  }
  return Status::ok();
}

}  // namespace

Status groupStart() {
  ++groupDepth;
  return Status::ok();
}

Status groupEnd() {
  if (groupDepth == 0) return invalidUsage("braidGroupEnd without a matching braidGroupStart");
  if (--groupDepth > 0) return Status::ok();
  std::vector<PendingOperation> ops = std::move(groupOps);
  groupOps.clear();
  // As NCCL does: the rest alone would post half of an exchange (a Send
  // whose Recv was refused), which the peers could never match.
  if (std::optional<Status> refused = std::exchange(groupRefusal, std::nullopt))
    return Status(refused->code(), strCat("a call of the group was refused, so none of them ran: ",
                                          refused->message()));
  std::vector<CallsInFlight::Entered> inFlight;
  for (const PendingOperation& p : ops) inFlight.push_back(p.handle->calls.enter());
  // Stream operations go to their streams as one batch per stream; the rest
  // run here, all communicators together.
  // A stream's batch with GPU buffers, or ordered on a CUDA stream, runs as
  // one task (enqueueStagedBatch).
  struct StreamBatch {
    std::shared_ptr<HostStream> stream;
    std::shared_ptr<CudaStreamBridge> cuda;
    std::optional<CudaStreamBridge::Gate> gate;  // its CUDA stream's hold
    std::vector<Operation> ops;
    std::vector<GpuPlacement> placements;
    bool staged = false;
  };
  std::map<HostStream*, StreamBatch> perStream;
  std::vector<std::pair<HostStream*, StreamBatch*>> inCallOrder;  // perStream's, by first call
  std::map<Communicator*, std::vector<Operation>> now;
  // GPU buffers go over to host memory now (or, for GPU jobs, are waited
  // for), after the work queued on their GPUs, and their results come back
  // once the whole group ran: the group's calls may run in any order, and
  // all at once.
  std::vector<StagedBuffers> staged;
  for (auto& p : ops)
    if (!p.stream) BRAID_RETURN_IF_ERROR(stageInto(p.op, p.gpu, contextOrderedCopies(), staged));
  for (auto& p : ops) {
    if (p.stream) {
      auto [entry, added] = perStream.try_emplace(p.stream.get());
      if (added) inCallOrder.emplace_back(entry->first, &entry->second);
      StreamBatch& batch = entry->second;
      batch.stream = p.stream;
      if (p.cuda) batch.cuda = p.cuda;
      batch.staged = batch.staged || onGpu(p.gpu);
      batch.ops.push_back(std::move(p.op));
      batch.placements.push_back(p.gpu);
    } else
      now[p.comm.get()].push_back(std::move(p.op));
  }
  // What the calls allocate is made before any CUDA stream waits
  // (docs/GPU.md); nothing for a group a stream will refuse.
  for (auto& [stream, batch] : perStream)
    if (batch.cuda) BRAID_RETURN_IF_ERROR(batch.cuda->refuseIfCapturing());
  // Each CUDA stream's bridge in the order of addresses, as every group
  // takes them, until the group's tasks are queued (orderMutex()).
  std::vector<std::mutex*> orderMutexes;
  for (auto& [stream, batch] : perStream)
    if (batch.cuda) orderMutexes.push_back(&batch.cuda->orderMutex());
  std::sort(orderMutexes.begin(), orderMutexes.end());
  std::vector<std::unique_lock<std::mutex>> inOrder;
  for (std::mutex* m : orderMutexes) inOrder.emplace_back(*m);
  for (auto& [stream, batch] : perStream) {
    if (!batch.cuda) continue;
    BRAID_RETURN_IF_ERROR(stream->communicator().prepareGpuCalls(batch.ops, stream->index()));
    if (batch.staged) BRAID_RETURN_IF_ERROR(batch.cuda->prepareStaging());
  }
  BRAID_RETURN_IF_ERROR(holdEveryCudaStream(inCallOrder));
  for (auto& [stream, batch] : perStream) {
    if (batch.cuda || batch.staged)
      enqueueStagedBatch(batch.stream, batch.cuda, batch.gate, std::move(batch.ops),
                         std::move(batch.placements));
    else
      stream->enqueue(std::move(batch.ops));
  }
  inOrder.clear();
  if (now.empty()) return Status::ok();
  // A group's one collective (beside any Send and Recv) runs first, as it
  // would alone (on the board, or timed by the tuner): a peer that made it
  // outside a group, as NCCL allows, or in a group with no Send or Recv,
  // takes that path and would wait there for this rank. Every rank's
  // collective comes before its point-to-point calls, so neither waits on
  // the other. Several collectives run together, as the group asked.
  size_t collectives = 0;
  for (const auto& [comm, batch] : now)
    for (const Operation& op : batch)
      collectives += op.args.kind != algo::CollectiveKind::kSendRecv;
  if (collectives == 1) {
    for (auto& [comm, batch] : now) {
      auto alone = std::find_if(batch.begin(), batch.end(), [](const Operation& op) {
        return op.args.kind != algo::CollectiveKind::kSendRecv;
      });
      if (alone == batch.end()) continue;
      BRAID_RETURN_IF_ERROR(comm->run({&*alone, 1}, 0));
      batch.erase(alone);
    }
    std::erase_if(now, [](const auto& entry) { return entry.second.empty(); });
  }
  if (!now.empty()) {
    std::vector<std::pair<Communicator*, std::vector<Operation>>> batches(now.begin(), now.end());
    BRAID_RETURN_IF_ERROR(Communicator::runTogether(batches));
  }
  for (StagedBuffers& s : staged) BRAID_RETURN_IF_ERROR(s.finish());
  return Status::ok();
}

}  // namespace braid::api

using braid::api::guard;

extern "C" {

const char* braidGetLastError(braidComm_t) {
  return braid::api::lastErrorMessage().c_str();
}

braidResult_t braidGroupStart(void) {
  return guard("braidGroupStart", [] { return braid::api::groupStart(); });
}

braidResult_t braidGroupEnd(void) {
  return guard("braidGroupEnd", [] { return braid::api::groupEnd(); });
}

}  // extern "C"
