// extern "C" collectives and point-to-point calls: each checks its
// arguments against the contract, works out whether it is in place, and
// hands one Operation to the group, the stream or the communicator.
#include <cstdint>
#include <functional>
#include <limits>

#include "src/common/strcat.h"
#include "src/device_staging.h"
#include "src/handles.h"
#include "src/memory_kind.h"

using braid::Operation;
using braid::Status;
using braid::algo::CollectiveKind;
using braid::api::guard;

namespace {

bool overlaps(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return aBytes > 0 && bBytes > 0 && pa < pb + bBytes && pb < pa + aBytes;
}

// The memory the `bytes` at `p` lie in, or no memory (host) for none; GPU
// memory must hold all of them in one allocation. An error names the
// argument.
braid::Result<braid::BufferMemory> memoryOf(const char* argument, const void* p, size_t bytes) {
  if (p == nullptr) return braid::BufferMemory{};
  braid::Result<braid::BufferMemory> memory = braid::memoryKindOf(p);
  if (!memory.isOk()) return memory.status().withContext(argument);
  if (memory->kind != braid::MemoryKind::kHost)
    if (Status inside = braid::checkInsideGpuAllocation(p, bytes); !inside.isOk())
      return inside.withContext(argument);
  return memory;
}

bool onGpu(const braid::BufferMemory& memory) {
  return memory.kind != braid::MemoryKind::kHost;
}

// A GPU buffer braid cannot serve here is refused by name, rather than read
// as host memory further down (which would crash).
Status refuseGpuMemory(const char* argument, const braid::BufferMemory& memory) {
  const std::string device =
      memory.device >= 0 ? braid::strCat("device ", memory.device) : std::string("device unknown");
  return braid::notSupported(braid::strCat(argument, " is ", braid::memoryKindName(memory.kind),
                                           " memory (", device,
                                           "): this build of braid moves host memory only"));
}

using braid::api::GpuPlacement;

GpuPlacement placementOf(const Operation& o, bool sendOnGpu, bool recvOnGpu) {
  GpuPlacement p;
  p.sendBytes = o.send ? braid::algo::sendBufferBytes(o.args) : 0;
  p.recvBytes = o.recv ? braid::algo::recvBufferBytes(o.args) : 0;
  p.sendOnGpu = sendOnGpu && p.sendBytes > 0;
  p.recvOnGpu = recvOnGpu && p.recvBytes > 0;
  return p;
}

// Runs `o` on host copies of its GPU buffers (src/device_staging.h), made
// and copied back with `copies`, by `run`.
Status runStaged(Operation o, const GpuPlacement& p, braid::GpuCopies& copies,
                 const std::function<Status(const Operation&)>& run) {
  BRAID_ASSIGN_OR_RETURN(braid::StagedBuffers staged,
                         braid::StagedBuffers::stage(o.send, p.sendBytes, p.sendOnGpu, o.recv,
                                                     p.recvBytes, p.recvOnGpu, copies));
  o.send = staged.send();
  o.recv = staged.recv();
  BRAID_RETURN_IF_ERROR(run(o));
  return staged.finish();
}

Status checkStreamOfComm(braidComm_t comm, braidStream_t stream) {
  if (&stream->stream->communicator() != comm->comm.get())
    return braid::invalidArgument("stream belongs to another communicator");
  return Status::ok();
}

// What a task on `host` runs a staged operation with.
std::function<Status(const Operation&)> runOn(braid::HostStream* host) {
  return [host](const Operation& staged) {
    return host->communicator().run({&staged, 1}, host->index());
  };
}

// The GPU whose device memory holds every buffer `o` uses, when the call
// can run as GPU jobs on it (Communicator::gpuJobsPossible); else -1, and
// the call is staged through host memory.
int gpuJobOrdinal(const Operation& o, braidComm_t comm, const braid::BufferMemory& sendMemory,
                  const braid::BufferMemory& recvMemory) {
  if (o.args.kind == CollectiveKind::kSendRecv) {
    // To the own rank (in a group) the bytes stay on the host connection's
    // loopback, which reads host memory only.
    if (!comm->comm->gpuSendRecvPossible() || o.peer == comm->comm->rank()) return -1;
  } else if (!comm->comm->gpuJobsPossible()) {
    return -1;
  }
  const GpuPlacement p = placementOf(o, onGpu(sendMemory), onGpu(recvMemory));
  auto deviceOf = [](const braid::BufferMemory& m) {
    return m.kind == braid::MemoryKind::kDevice ? m.device : -1;
  };
  int ordinal = -1;
  if (p.sendBytes > 0) ordinal = deviceOf(sendMemory);
  if (p.recvBytes > 0) {
    const int recvOrdinal = deviceOf(recvMemory);
    if (p.sendBytes > 0 && recvOrdinal != ordinal) return -1;
    ordinal = recvOrdinal;
  }
  return ordinal;
}

// Runs `o` as GPU jobs on GPU `ordinal` (src/gpu_path.h), after the work
// the caller queued on that GPU before the call.
Status runGpuJobs(Operation o, int ordinal, braid::Communicator& comm, int streamIndex) {
  o.gpuOrdinal = ordinal;
  const void* buffer = o.send ? o.send : o.recv;
  if (buffer) BRAID_RETURN_IF_ERROR(braid::waitForGpuWork(buffer, "waiting for the GPU"));
  return comm.run({&o, 1}, streamIndex);
}

// Runs `o`, whose send or recv is on a GPU, as GPU jobs or on host copies of
// its buffers: now, or on the stream's thread (after the calls queued before
// it); or refuses it.
Status submitStaged(Operation o, braidComm_t comm, braidStream_t stream,
                    const braid::BufferMemory& sendMemory, const braid::BufferMemory& recvMemory) {
  if (!braid::gpuStagingBuilt())
    return onGpu(sendMemory) ? refuseGpuMemory("sendbuff", sendMemory)
                             : refuseGpuMemory("recvbuff", recvMemory);
  if (braid::api::groupOpen()) {
    const GpuPlacement placement = placementOf(o, onGpu(sendMemory), onGpu(recvMemory));
    o.gpuOrdinal = gpuJobOrdinal(o, comm, sendMemory, recvMemory);
    return braid::api::submitStagedToGroup(comm, stream, std::move(o), placement);
  }
  if (const int ordinal = gpuJobOrdinal(o, comm, sendMemory, recvMemory); ordinal >= 0) {
    if (stream == nullptr) return runGpuJobs(std::move(o), ordinal, *comm->comm, 0);
    BRAID_RETURN_IF_ERROR(checkStreamOfComm(comm, stream));
    braid::HostStream* host = stream->stream.get();  // outlives its queued tasks
    host->enqueueTask([=, o = std::move(o)](const Status& earlier) -> Status {
      if (!earlier.isOk()) return Status::ok();  // as a call after a failure: not run
      return runGpuJobs(o, ordinal, host->communicator(), host->index());
    });
    return Status::ok();
  }
  const GpuPlacement placement = placementOf(o, onGpu(sendMemory), onGpu(recvMemory));
  if (stream == nullptr)
    return runStaged(
        std::move(o), placement, braid::contextOrderedCopies(),
        [&](const Operation& staged) { return braid::api::submit(comm, nullptr, {staged}); });
  BRAID_RETURN_IF_ERROR(checkStreamOfComm(comm, stream));
  braid::HostStream* host = stream->stream.get();  // outlives its queued tasks
  host->enqueueTask([=, o = std::move(o)](const Status& earlier) -> Status {
    if (!earlier.isOk()) return Status::ok();  // as a call after a failure: not run
    return runStaged(o, placement, braid::contextOrderedCopies(), runOn(host));
  });
  return Status::ok();
}

// Runs `o` on a braid stream ordered on a CUDA stream (src/cuda_stream.h):
// the CUDA stream is held at this point of its work, and the braid stream's
// thread runs the call once the stream gets there, staging GPU buffers with
// the bridge's copies, then lets the CUDA stream go on.
Status submitOnCudaStream(Operation o, braidComm_t comm, braidStream_t stream) {
  BRAID_RETURN_IF_ERROR(checkStreamOfComm(comm, stream));
  BRAID_ASSIGN_OR_RETURN(const braid::BufferMemory sendMemory,
                         memoryOf("sendbuff", o.send, braid::algo::sendBufferBytes(o.args)));
  BRAID_ASSIGN_OR_RETURN(const braid::BufferMemory recvMemory,
                         memoryOf("recvbuff", o.recv, braid::algo::recvBufferBytes(o.args)));
  const GpuPlacement placement = placementOf(o, onGpu(sendMemory), onGpu(recvMemory));
  if (placement.sendOnGpu || placement.recvOnGpu)
    BRAID_RETURN_IF_ERROR(stream->cuda->gpuBuffersAllowed());
  // Inside a group: run when the CUDA stream reaches braidGroupEnd, all the
  // group's calls on this stream together, as GPU jobs or staged around the
  // batch.
  if (braid::api::groupOpen()) {
    if (placement.sendOnGpu || placement.recvOnGpu)
      o.gpuOrdinal = gpuJobOrdinal(o, comm, sendMemory, recvMemory);
    return braid::api::submitStagedToGroup(comm, stream, std::move(o), placement);
  }
  // As GPU jobs, with no wait for the GPU: the bridge has the CUDA stream's
  // earlier work done when the call runs (and waiting for the whole GPU
  // would wait for the CUDA stream, which waits for the call).
  const int ordinal = (placement.sendOnGpu || placement.recvOnGpu)
                          ? gpuJobOrdinal(o, comm, sendMemory, recvMemory)
                          : -1;
  braid::HostStream* host = stream->stream.get();  // outlives its queued tasks
  std::shared_ptr<braid::CudaStreamBridge> bridge = stream->cuda;
  // What the call allocates is made now, before the CUDA stream waits
  // (docs/GPU.md); nothing for a call the stream will refuse.
  BRAID_RETURN_IF_ERROR(bridge->refuseIfCapturing());
  std::lock_guard order(bridge->orderMutex());
  if (ordinal >= 0) {
    Operation onGpu = o;
    onGpu.gpuOrdinal = ordinal;
    BRAID_RETURN_IF_ERROR(comm->comm->prepareGpuCalls({&onGpu, 1}, host->index()));
  } else if (placement.sendOnGpu || placement.recvOnGpu) {
    BRAID_RETURN_IF_ERROR(bridge->prepareStaging());
  }
  BRAID_ASSIGN_OR_RETURN(braid::CudaStreamBridge::Gate gate, bridge->hold());
  host->enqueueTask([=, o = std::move(o)](const Status& earlier) -> Status {
    // After a failure too: the CUDA stream must not hang.
    const braid::CudaStreamBridge::ReleaseAtExit release(*bridge, gate);
    Status outcome = Status::ok();
    if (earlier.isOk()) {
      outcome = bridge->awaitReached(gate, host->communicator().timeout(),
                                     host->communicator().abortedFlag());
      if (outcome.isOk() && ordinal >= 0) {
        Operation onGpu = o;
        onGpu.gpuOrdinal = ordinal;
        outcome = host->communicator().run({&onGpu, 1}, host->index());
      } else if (outcome.isOk()) {
        outcome = runStaged(o, placement, *bridge, runOn(host));
      }
    }
    return outcome;
  });
  return Status::ok();
}

struct Call {
  const char* name;
  CollectiveKind kind;
  const void* send;
  void* recv;
  size_t count;
  braidDataType_t dtype;
  braidRedOp_t op = braidSum;
  bool usesOp = false;
  int root = -1;
  bool usesRoot = false;
};

Status checkAndSubmit(const Call& c, braidComm_t comm, braidStream_t stream) {
  BRAID_RETURN_IF_ERROR(braid::api::checkComm(comm));
  const braid::CallsInFlight::Entered inFlight = comm->calls.enter();
  if (c.dtype < 0 || c.dtype >= braidNumTypes)
    return braid::invalidArgument(
        braid::strCat("datatype=", static_cast<int>(c.dtype), " is not a braidDataType_t"));
  if (c.usesOp && (c.op < 0 || c.op >= braidNumOps))
    return braid::invalidArgument(
        braid::strCat("op=", static_cast<int>(c.op), " is not a braidRedOp_t"));
  const int nranks = comm->comm->size(), rank = comm->comm->rank();
  if (c.usesRoot && (c.root < 0 || c.root >= nranks))
    return braid::invalidArgument(
        braid::strCat("root=", c.root, " is out of range [0, ", nranks, ")"));
  if (stream) BRAID_RETURN_IF_ERROR(braid::api::checkStream(stream));
  if (c.count == 0 && c.kind != CollectiveKind::kBarrier) return Status::ok();

  Operation o;
  o.name = c.name;
  o.args.kind = c.kind;
  o.args.count = c.count;
  o.args.dtype = static_cast<braid::DataType>(c.dtype);
  o.args.op = static_cast<braid::RedOp>(c.op);
  o.args.root = c.usesRoot ? c.root : -1;
  o.args.rank = rank;
  o.args.nranks = nranks;
  const size_t es = braid::dataTypeSize(o.args.dtype);
  if (c.count > std::numeric_limits<size_t>::max() / es / static_cast<size_t>(nranks))
    return braid::invalidArgument(braid::strCat("count=", c.count, " is too large"));
  const size_t bytes = c.count * es;
  const bool isRoot = rank == c.root;
  auto* recvBytes = static_cast<uint8_t*>(c.recv);
  auto* sendBytes = static_cast<const uint8_t*>(c.send);

  // Which buffers must be present on this rank, and the in-place pattern.
  bool needSend = true, needRecv = true;
  bool inPlace = false;
  switch (c.kind) {
    case CollectiveKind::kAllReduce:
      inPlace = c.send == c.recv;
      break;
    case CollectiveKind::kBroadcast:
      needSend = isRoot;
      inPlace = isRoot && c.send == c.recv;
      break;
    case CollectiveKind::kReduce:
      needRecv = isRoot;
      inPlace = isRoot && c.send == c.recv;
      break;
    case CollectiveKind::kAllGather:
      inPlace = recvBytes && sendBytes == recvBytes + rank * bytes;
      break;
    case CollectiveKind::kReduceScatter:
      inPlace = sendBytes && recvBytes == sendBytes + rank * bytes;
      break;
    case CollectiveKind::kAllToAll:
      break;
    case CollectiveKind::kGather:
      needRecv = isRoot;
      inPlace = isRoot && recvBytes && sendBytes == recvBytes + c.root * bytes;
      break;
    case CollectiveKind::kScatter:
      needSend = isRoot;
      inPlace = isRoot && sendBytes && recvBytes == sendBytes + c.root * bytes;
      break;
    case CollectiveKind::kBarrier:
      needSend = needRecv = false;
      break;
    case CollectiveKind::kSendRecv:
      break;
  }
  if (needSend && !c.send)
    return braid::invalidArgument(braid::strCat("sendbuff is NULL with count=", c.count));
  if (needRecv && !c.recv)
    return braid::invalidArgument(braid::strCat("recvbuff is NULL with count=", c.count));
  o.args.inPlace = inPlace;
  if (needSend && needRecv && !inPlace) {
    size_t sendSize = braid::algo::sendBufferBytes(o.args),
           recvSize = braid::algo::recvBufferBytes(o.args);
    if (overlaps(c.send, sendSize, c.recv, recvSize))
      return braid::invalidArgument(
          c.kind == CollectiveKind::kAllToAll
              ? std::string("sendbuff and recvbuff overlap (AllToAll is never in place)")
              : std::string("sendbuff and recvbuff overlap without being in place"));
  }
  o.send = needSend ? c.send : nullptr;
  o.recv = needRecv ? c.recv : nullptr;
  if (stream != nullptr && stream->cuda) return submitOnCudaStream(std::move(o), comm, stream);
  // While the process has no CUDA driver loaded this is an atomic load and a
  // coarse clock read. In place, both buffers lie in one allocation, so one
  // question to the driver, about the one that holds the other, answers for
  // both.
  if ((needSend || needRecv) && braid::gpuMemoryPossible()) {
    const size_t sendSize = braid::algo::sendBufferBytes(o.args),
                 recvSize = braid::algo::recvBufferBytes(o.args);
    braid::BufferMemory sendMemory, recvMemory;
    if (needRecv && inPlace && needSend) {
      const bool recvHoldsSend = recvSize > sendSize;  // AllGather, Gather
      BRAID_ASSIGN_OR_RETURN(sendMemory, recvHoldsSend ? memoryOf("recvbuff", c.recv, recvSize)
                                                       : memoryOf("sendbuff", c.send, sendSize));
      recvMemory = sendMemory;
    } else {
      BRAID_ASSIGN_OR_RETURN(sendMemory,
                             memoryOf("sendbuff", needSend ? c.send : nullptr, sendSize));
      if (needRecv) {
        BRAID_ASSIGN_OR_RETURN(recvMemory, memoryOf("recvbuff", c.recv, recvSize));
      }
    }
    if (onGpu(sendMemory) || onGpu(recvMemory))
      return submitStaged(std::move(o), comm, stream, sendMemory, recvMemory);
  }
  return braid::api::submit(comm, stream, {std::move(o)});
}

// `c` checked and run, its failure kept by an open group.
braidResult_t checkedCall(const Call& c, braidComm_t comm, braidStream_t stream) {
  return guard(c.name,
               [&] { return braid::api::notedInGroup(c.name, checkAndSubmit(c, comm, stream)); });
}

Status pointToPoint(const char* name, bool isSend, const void* buffer, size_t count,
                    braidDataType_t dtype, int peer, braidComm_t comm, braidStream_t stream) {
  BRAID_RETURN_IF_ERROR(braid::api::checkComm(comm));
  const braid::CallsInFlight::Entered inFlight = comm->calls.enter();
  if (dtype < 0 || dtype >= braidNumTypes)
    return braid::invalidArgument(
        braid::strCat("datatype=", static_cast<int>(dtype), " is not a braidDataType_t"));
  const int nranks = comm->comm->size();
  if (peer < 0 || peer >= nranks)
    return braid::invalidArgument(
        braid::strCat("peer=", peer, " is out of range [0, ", nranks, ")"));
  if (peer == comm->comm->rank() && !braid::api::groupOpen())
    return braid::invalidArgument(
        "peer is the caller's own rank, which is allowed only inside a group");
  if (stream) BRAID_RETURN_IF_ERROR(braid::api::checkStream(stream));
  if (count > 0 && !buffer)
    return braid::invalidArgument(
        braid::strCat(isSend ? "sendbuff" : "recvbuff", " is NULL with count=", count));
  if (count >
      std::numeric_limits<size_t>::max() / braid::dataTypeSize(static_cast<braid::DataType>(dtype)))
    return braid::invalidArgument(braid::strCat("count=", count, " is too large"));
  Operation o;
  o.name = name;
  o.args.kind = CollectiveKind::kSendRecv;
  o.args.count = count;
  o.args.dtype = static_cast<braid::DataType>(dtype);
  o.peer = peer;
  o.isSend = isSend;
  if (isSend)
    o.send = buffer;
  else
    o.recv = const_cast<void*>(buffer);
  if (stream != nullptr && stream->cuda) return submitOnCudaStream(std::move(o), comm, stream);
  braid::BufferMemory memory;
  if (count > 0 && braid::gpuMemoryPossible()) {
    BRAID_ASSIGN_OR_RETURN(memory, memoryOf(isSend ? "sendbuff" : "recvbuff", buffer,
                                            count * braid::dataTypeSize(o.args.dtype)));
  }
  if (onGpu(memory))
    return submitStaged(std::move(o), comm, stream, isSend ? memory : braid::BufferMemory{},
                        isSend ? braid::BufferMemory{} : memory);
  return braid::api::submit(comm, stream, {std::move(o)});
}

}  // namespace

extern "C" {

braidResult_t braidAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, braidRedOp_t op, braidComm_t comm,
                             braidStream_t stream) {
  Call c{
      "braidAllReduce", CollectiveKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, true};
  return checkedCall(c, comm, stream);
}

braidResult_t braidBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, int root, braidComm_t comm,
                             braidStream_t stream) {
  Call c{"braidBroadcast", CollectiveKind::kBroadcast, sendbuff, recvbuff, count, datatype};
  c.root = root;
  c.usesRoot = true;
  return checkedCall(c, comm, stream);
}

braidResult_t braidReduce(const void* sendbuff, void* recvbuff, size_t count,
                          braidDataType_t datatype, braidRedOp_t op, int root, braidComm_t comm,
                          braidStream_t stream) {
  Call c{
      "braidReduce", CollectiveKind::kReduce, sendbuff, recvbuff, count, datatype, op, true, root,
      true};
  return checkedCall(c, comm, stream);
}

braidResult_t braidAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                             braidDataType_t datatype, braidComm_t comm, braidStream_t stream) {
  Call c{"braidAllGather", CollectiveKind::kAllGather, sendbuff, recvbuff, sendcount, datatype};
  return checkedCall(c, comm, stream);
}

braidResult_t braidReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                 braidDataType_t datatype, braidRedOp_t op, braidComm_t comm,
                                 braidStream_t stream) {
  Call c{"braidReduceScatter",
         CollectiveKind::kReduceScatter,
         sendbuff,
         recvbuff,
         recvcount,
         datatype,
         op,
         true};
  return checkedCall(c, comm, stream);
}

braidResult_t braidAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                            braidDataType_t datatype, braidComm_t comm, braidStream_t stream) {
  Call c{"braidAllToAll", CollectiveKind::kAllToAll, sendbuff, recvbuff, count, datatype};
  return checkedCall(c, comm, stream);
}

braidResult_t braidGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                          braidDataType_t datatype, int root, braidComm_t comm,
                          braidStream_t stream) {
  Call c{"braidGather", CollectiveKind::kGather, sendbuff, recvbuff, sendcount, datatype};
  c.root = root;
  c.usesRoot = true;
  return checkedCall(c, comm, stream);
}

braidResult_t braidScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                           braidDataType_t datatype, int root, braidComm_t comm,
                           braidStream_t stream) {
  Call c{"braidScatter", CollectiveKind::kScatter, sendbuff, recvbuff, recvcount, datatype};
  c.root = root;
  c.usesRoot = true;
  return checkedCall(c, comm, stream);
}

braidResult_t braidBarrier(braidComm_t comm, braidStream_t stream) {
  Call c{"braidBarrier", CollectiveKind::kBarrier, nullptr, nullptr, 0, braidUint8};
  return checkedCall(c, comm, stream);
}

braidResult_t braidSend(const void* sendbuff, size_t count, braidDataType_t datatype, int peer,
                        braidComm_t comm, braidStream_t stream) {
  return guard("braidSend", [&] {
    return braid::api::notedInGroup("braidSend", pointToPoint("braidSend", true, sendbuff, count,
                                                              datatype, peer, comm, stream));
  });
}

braidResult_t braidRecv(void* recvbuff, size_t count, braidDataType_t datatype, int peer,
                        braidComm_t comm, braidStream_t stream) {
  return guard("braidRecv", [&] {
    return braid::api::notedInGroup("braidRecv", pointToPoint("braidRecv", false, recvbuff, count,
                                                              datatype, peer, comm, stream));
  });
}

}  // extern "C"
