// The ABI edge's shared parts: last-error storage, result mapping, handle
// checks, and group calls (per thread, nestable).
#include <algorithm>
#include <map>

#include "src/common/log.h"
#include "src/common/strcat.h"
#include "src/device_staging.h"
#include "src/handles.h"

namespace braid::api {

namespace {
thread_local std::string lastError;

struct PendingOperation {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<HostStream> stream;  // null: run by braidGroupEnd
  Operation op;
  GpuPlacement gpu;  // buffers braidGroupEnd stages (stream null only)
};
thread_local int groupDepth = 0;
thread_local std::vector<PendingOperation> groupOps;
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

Status submit(braidComm_t comm, braidStream_t stream, std::vector<Operation> ops) {
  if (stream) {
    BRAID_RETURN_IF_ERROR(checkStream(stream));
    if (&stream->stream->communicator() != comm->comm.get())
      return invalidArgument("stream belongs to another communicator");
  }
  if (groupDepth > 0) {
    for (auto& op : ops)
      groupOps.push_back({comm->comm, stream ? stream->stream : nullptr, std::move(op)});
    return Status::ok();
  }
  if (stream) {
    stream->stream->enqueue(std::move(ops));
    return Status::ok();
  }
  return comm->comm->run(ops, 0);
}

Status submitStagedToGroup(braidComm_t comm, Operation op, const GpuPlacement& placement) {
  if (groupDepth == 0) return internalError("no group is open");
  groupOps.push_back({comm->comm, nullptr, std::move(op), placement});
  return Status::ok();
}

Status groupStart() {
  ++groupDepth;
  return Status::ok();
}

Status groupEnd() {
  if (groupDepth == 0) return invalidUsage("braidGroupEnd without a matching braidGroupStart");
  if (--groupDepth > 0) return Status::ok();
  std::vector<PendingOperation> ops = std::move(groupOps);
  groupOps.clear();
  // Stream operations go to their streams as one batch per stream; the rest
  // run here, all communicators together.
  std::map<HostStream*, std::vector<Operation>> perStream;
  std::map<Communicator*, std::vector<Operation>> now;
  std::vector<std::shared_ptr<Communicator>> keepAlive;
  // GPU buffers go over to host memory now, after the work queued on their
  // GPUs, and their results come back once the whole group ran: the
  // group's calls may run in any order, and all at once.
  std::vector<StagedBuffers> staged;
  for (auto& p : ops) {
    const GpuPlacement& g = p.gpu;
    if (!g.sendOnGpu && !g.recvOnGpu) continue;
    BRAID_ASSIGN_OR_RETURN(StagedBuffers s,
                           StagedBuffers::stage(p.op.send, g.sendBytes, g.sendOnGpu, p.op.recv,
                                                g.recvBytes, g.recvOnGpu, contextOrderedCopies()));
    p.op.send = s.send();
    p.op.recv = s.recv();
    staged.push_back(std::move(s));
  }
  for (auto& p : ops) {
    keepAlive.push_back(p.comm);
    if (p.stream)
      perStream[p.stream.get()].push_back(std::move(p.op));
    else
      now[p.comm.get()].push_back(std::move(p.op));
  }
  for (auto& [stream, batch] : perStream) stream->enqueue(std::move(batch));
  if (now.empty()) return Status::ok();
  std::vector<std::pair<Communicator*, std::vector<Operation>>> batches(now.begin(), now.end());
  BRAID_RETURN_IF_ERROR(Communicator::runTogether(batches));
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
