// extern "C" library and communicator calls: argument checks, then the
// communicator layer.
#include <cstring>

#include "src/bootstrap.h"
#include "src/common/env.h"
#include "src/common/log.h"
#include "src/common/strcat.h"
#include "src/gpu_path.h"
#include "src/handles.h"
#include "src/launch_env.h"
#include "transports/cuda_ipc/shared_gpu_memory.h"
#include "transports/shm/host_allocations.h"

using braid::Status;
using braid::api::checkComm;
using braid::api::guard;

namespace {

Status makeUniqueId(braidUniqueId* uniqueId) {
  BRAID_ASSIGN_OR_RETURN(braid::Config config, braid::loadConfig());
  braid::RendezvousInfo info;
  BRAID_RETURN_IF_ERROR(braid::randomBytes(info.secret));
  BRAID_ASSIGN_OR_RETURN(auto listenAt, braid::chooseBootstrapAddress(config.socketIfname,
                                                                      braid::Deadline::after(10)));
  BRAID_ASSIGN_OR_RETURN(
      info.root, braid::startRendezvousServer(listenAt, info.secret, config.timeoutSeconds));
  info.encode(uniqueId->internal);
  BRAID_INFO("unique id: rendezvous at ", info.root.toString());
  return Status::ok();
}

Status checkRank(int nranks, int rank) {
  if (nranks < 1) return braid::invalidArgument(braid::strCat("nranks=", nranks, " must be >= 1"));
  if (rank < 0 || rank >= nranks)
    return braid::invalidArgument(
        braid::strCat("rank=", rank, " is out of range [0, ", nranks, ")"));
  return Status::ok();
}

braid::Result<std::shared_ptr<braid::Communicator>> createCommunicator(int nranks,
                                                                       const braidUniqueId& id,
                                                                       int rank) {
  BRAID_ASSIGN_OR_RETURN(braid::RendezvousInfo info, braid::RendezvousInfo::decode(id.internal));
  BRAID_ASSIGN_OR_RETURN(braid::Config config, braid::loadConfig());
  return braid::Communicator::create(info, nranks, rank, config);
}

// The key, after the store's prefix, under which rank 0 publishes the id.
constexpr const char* kStoreUniqueIdKey = "braid/uniqueId";

// Turns what a store callback returned into a Status that names the key.
Status storeOutcome(braidResult_t result, const char* call, const std::string& key,
                    double timeoutSeconds = 0) {
  if (result == braidSuccess) return Status::ok();
  if (result == braidTimeout)
    return Status(braid::ErrorCode::kTimeout,
                  braid::strCat("store->", call, " of '", key, "' timed out",
                                timeoutSeconds > 0 ? braid::strCat(" after ", timeoutSeconds, " s")
                                                   : std::string(),
                                timeoutSeconds > 0 ? ": did rank 0 reach its init?" : ""));
  if (result < braidSystemError || result > braidNotSupported || result == braidInProgress)
    return braid::invalidArgument(braid::strCat("store->", call, " of '", key, "' returned ",
                                                static_cast<int>(result),
                                                ", which is not a braidResult_t error code"));
  return Status(
      static_cast<braid::ErrorCode>(result),
      braid::strCat("store->", call, " of '", key, "' failed (", braidGetErrorString(result), ")"));
}

// `call`'s handle for `comm`; out of memory for it is an error of `call`,
// never an exception out of the C ABI.
braidResult_t newCommHandle(const char* call, std::shared_ptr<braid::Communicator> comm,
                            braidComm_t* out) {
  return guard(call, [&]() -> Status {
    auto handle = std::make_unique<braidComm>();
    handle->comm = std::move(comm);
    *out = handle.release();
    return Status::ok();
  });
}

}  // namespace

extern "C" {

const char* braidGetErrorString(braidResult_t result) {
  switch (result) {
    case braidSuccess:
      return "no error";
    case braidSystemError:
      return "system error (the OS or network failed)";
    case braidInternalError:
      return "internal error (a bug in braid)";
    case braidInvalidArgument:
      return "invalid argument";
    case braidInvalidUsage:
      return "invalid usage";
    case braidRemoteError:
      return "remote error (a peer failed, disconnected or aborted)";
    case braidInProgress:
      return "operation in progress";
    case braidTimeout:
      return "timeout (no progress within BRAID_TIMEOUT)";
    case braidUnhandledCudaError:
      return "unhandled CUDA error";
    case braidNotSupported:
      return "not supported";
  }
  return "unknown result code";
}

braidResult_t braidGetVersion(int* version) {
  return guard("braidGetVersion", [&]() -> Status {
    if (!version) return braid::invalidArgument("version is NULL");
    *version = BRAID_VERSION_CODE;
    return Status::ok();
  });
}

braidResult_t braidGetUniqueId(braidUniqueId* uniqueId) {
  return guard("braidGetUniqueId", [&]() -> Status {
    if (!uniqueId) return braid::invalidArgument("uniqueId is NULL");
    return makeUniqueId(uniqueId);
  });
}

braidResult_t braidCommInitRank(braidComm_t* comm, int nranks, braidUniqueId uniqueId, int rank) {
  std::shared_ptr<braid::Communicator> created;
  braidResult_t r = guard("braidCommInitRank", [&]() -> Status {
    if (!comm) return braid::invalidArgument("comm is NULL");
    *comm = nullptr;
    BRAID_RETURN_IF_ERROR(checkRank(nranks, rank));
    BRAID_ASSIGN_OR_RETURN(created, createCommunicator(nranks, uniqueId, rank));
    return Status::ok();
  });
  return r == braidSuccess ? newCommHandle("braidCommInitRank", std::move(created), comm) : r;
}

braidResult_t braidCommInitRankWithStore(braidComm_t* comm, int nranks, const braidStore_t* store,
                                         int rank) {
  std::shared_ptr<braid::Communicator> created;
  braidResult_t r = guard("braidCommInitRankWithStore", [&]() -> Status {
    if (!comm) return braid::invalidArgument("comm is NULL");
    *comm = nullptr;
    if (!store) return braid::invalidArgument("store is NULL");
    if (!store->set) return braid::invalidArgument("store->set is NULL");
    if (!store->get) return braid::invalidArgument("store->get is NULL");
    BRAID_RETURN_IF_ERROR(checkRank(nranks, rank));
    BRAID_ASSIGN_OR_RETURN(braid::Config config, braid::loadConfig());
    std::string key = braid::strCat(store->keyPrefix ? store->keyPrefix : "", kStoreUniqueIdKey);
    braidUniqueId id;
    if (rank == 0) {
      BRAID_RETURN_IF_ERROR(makeUniqueId(&id));
      BRAID_RETURN_IF_ERROR(storeOutcome(
          store->set(store->context, key.c_str(), id.internal, sizeof id.internal), "set", key));
    } else {
      size_t bytes = 0;
      BRAID_INFO("rank ", rank, " waits up to ", config.timeoutSeconds, " s for '", key,
                 "' in the store");
      BRAID_RETURN_IF_ERROR(
          storeOutcome(store->get(store->context, key.c_str(), id.internal, sizeof id.internal,
                                  &bytes, config.timeoutSeconds),
                       "get", key, config.timeoutSeconds));
      if (bytes != sizeof id.internal)
        return braid::invalidUsage(braid::strCat(
            "the store's value of '", key, "' has ", bytes, " bytes, not the ", sizeof id.internal,
            " of a braid unique id: does something else use that key?"));
    }
    BRAID_ASSIGN_OR_RETURN(created, createCommunicator(nranks, id, rank));
    return Status::ok();
  });
  return r == braidSuccess ? newCommHandle("braidCommInitRankWithStore", std::move(created), comm)
                           : r;
}

braidResult_t braidCommInitFromEnv(braidComm_t* comm) {
  std::shared_ptr<braid::Communicator> created;
  braidResult_t r = guard("braidCommInitFromEnv", [&]() -> Status {
    if (!comm) return braid::invalidArgument("comm is NULL");
    *comm = nullptr;
    BRAID_ASSIGN_OR_RETURN(braid::Config config, braid::loadConfig());
    BRAID_ASSIGN_OR_RETURN(braid::LaunchVariables launch, braid::launchVariablesFromEnv());
    braid::RendezvousInfo info;
    info.serverStartsInRankZerosInit = true;
    BRAID_ASSIGN_OR_RETURN(info.root, braid::tcp::SocketAddress::parse(launch.address));
    std::string secret = braid::envString("BRAID_SECRET");
    if (!secret.empty() && !braid::fromHex(secret, info.secret))
      return braid::invalidArgument("BRAID_SECRET must be 32 hex digits");
    if (secret.empty())
      BRAID_INFO(
          "BRAID_SECRET is not set: connections are not authenticated beyond the job's address");
    if (launch.rank == 0) {
      auto started = braid::startRendezvousServer(info.root, info.secret, config.timeoutSeconds);
      if (!started.isOk())
        return started.status().withContext(
            braid::strCat("rank 0 cannot listen on ", launch.address));
    }
    BRAID_INFO("init from ", launch.source, " variables: rank ", launch.rank, " of ", launch.size,
               ", rank 0 at ", launch.address);
    BRAID_ASSIGN_OR_RETURN(created,
                           braid::Communicator::create(info, launch.size, launch.rank, config));
    return Status::ok();
  });
  return r == braidSuccess ? newCommHandle("braidCommInitFromEnv", std::move(created), comm) : r;
}

braidResult_t braidCommSplit(braidComm_t comm, int color, int key, braidComm_t* newcomm) {
  std::shared_ptr<braid::Communicator> created;
  braidResult_t r = guard("braidCommSplit", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(checkComm(comm));
    const braid::CallsInFlight::Entered inFlight = comm->calls.enter();
    if (!newcomm) return braid::invalidArgument("newcomm is NULL");
    *newcomm = nullptr;
    BRAID_ASSIGN_OR_RETURN(created, comm->comm->split(color, key));
    return Status::ok();
  });
  if (r != braidSuccess || !created) return r;
  return newCommHandle("braidCommSplit", std::move(created), newcomm);
}

braidResult_t braidCommDestroy(braidComm_t comm) {
  return guard("braidCommDestroy", [&]() -> Status {
    if (!comm) return Status::ok();
    if (comm->magic != braidComm::kMagic)
      return braid::invalidArgument("comm is not a live communicator");
    std::vector<std::shared_ptr<braid::HostStream>> streams;
    {
      std::lock_guard lock(comm->streamsMutex);
      for (auto& w : comm->streams)
        if (auto s = w.lock()) streams.push_back(std::move(s));
    }
    for (auto& s : streams)
      if (s->onWorkerThread())
        return braid::invalidUsage(
            "a communicator cannot be destroyed from a callback of one of its streams");
    for (auto& s : streams) (void)s->synchronize();
    comm->calls.awaitNone();
    for (auto& s : streams) s->detachFromCommunicator();
    comm->comm->shutdown();
    comm->magic = 0;
    delete comm;
    return Status::ok();
  });
}

braidResult_t braidCommAbort(braidComm_t comm) {
  return guard("braidCommAbort", [&]() -> Status {
    if (!comm) return braid::invalidArgument("comm is NULL");
    if (comm->magic != braidComm::kMagic)
      return braid::invalidArgument("comm is not a live communicator");
    comm->comm->abort();
    return Status::ok();
  });
}

braidResult_t braidCommGetAsyncError(braidComm_t comm, braidResult_t* asyncError) {
  return guard("braidCommGetAsyncError", [&]() -> Status {
    if (!comm || comm->magic != braidComm::kMagic)
      return braid::invalidArgument("comm is NULL or not live");
    if (!asyncError) return braid::invalidArgument("asyncError is NULL");
    // Aborted, it answers as its calls do, for a watchdog that polls it.
    *asyncError = comm->comm->aborted() ? braidInvalidUsage
                                        : static_cast<braidResult_t>(comm->comm->asyncError());
    return Status::ok();
  });
}

braidResult_t braidCommRegister(braidComm_t comm, void* buff, size_t size, void** handle) {
  return guard("braidCommRegister", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(checkComm(comm));
    if (!handle) return braid::invalidArgument("handle is NULL");
    BRAID_ASSIGN_OR_RETURN(uint64_t id, comm->comm->registry().add(buff, size));
    *handle = reinterpret_cast<void*>(static_cast<uintptr_t>(id));
    return Status::ok();
  });
}

braidResult_t braidCommDeregister(braidComm_t comm, void* handle) {
  return guard("braidCommDeregister", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(checkComm(comm));
    if (!handle) return braid::invalidArgument("handle is NULL");
    return comm->comm->registry().remove(reinterpret_cast<uintptr_t>(handle));
  });
}

braidResult_t braidHostAlloc(void** ptr, size_t size) {
  return guard("braidHostAlloc", [&]() -> Status {
    if (!ptr) return braid::invalidArgument("ptr is NULL");
    if (size == 0) return braid::invalidArgument("size is 0");
    BRAID_ASSIGN_OR_RETURN(*ptr, braid::shm::allocateShared(size));
    return Status::ok();
  });
}

braidResult_t braidHostFree(void* ptr) {
  return guard("braidHostFree", [&]() -> Status {
    if (!ptr) return Status::ok();
    return braid::shm::freeShared(ptr);
  });
}

braidResult_t braidMemAlloc(void** ptr, size_t size) {
  return guard("braidMemAlloc", [&]() -> Status {
    if (!ptr) return braid::invalidArgument("ptr is NULL");
    if (size == 0) return braid::invalidArgument("size is 0");
    if (!braid::GpuPath::built())
      return braid::notSupported("this build of braid moves host memory only (-Dcuda=disabled)");
    BRAID_ASSIGN_OR_RETURN(*ptr, braid::transport::cuda_ipc::allocateSharedGpuMemory(size));
    return Status::ok();
  });
}

braidResult_t braidMemFree(void* ptr) {
  return guard("braidMemFree", [&]() -> Status {
    if (!ptr) return Status::ok();
    return braid::transport::cuda_ipc::freeSharedGpuMemory(ptr);
  });
}

braidResult_t braidCommCount(braidComm_t comm, int* count) {
  return guard("braidCommCount", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(checkComm(comm));
    if (!count) return braid::invalidArgument("count is NULL");
    *count = comm->comm->size();
    return Status::ok();
  });
}

braidResult_t braidCommUserRank(braidComm_t comm, int* rank) {
  return guard("braidCommUserRank", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(checkComm(comm));
    if (!rank) return braid::invalidArgument("rank is NULL");
    *rank = comm->comm->rank();
    return Status::ok();
  });
}

braidResult_t braidCommGetLastAlgorithm(braidComm_t comm, const char* collective,
                                        const char** algorithm) {
  return guard("braidCommGetLastAlgorithm", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(checkComm(comm));
    if (!collective) return braid::invalidArgument("collective is NULL");
    if (!algorithm) return braid::invalidArgument("algorithm is NULL");
    braid::algo::CollectiveKind kind;
    if (!braid::collectiveFromName(collective, &kind))
      return braid::invalidArgument(
          braid::strCat("collective '", collective, "' is not a collective name"));
    // Names live in the static algorithm registry, so the pointer stays valid.
    std::string_view name = comm->comm->lastAlgorithm(kind);
    *algorithm = name.empty() ? "" : name.data();
    return Status::ok();
  });
}

braidResult_t braidCommSetTimeout(braidComm_t comm, double seconds) {
  return guard("braidCommSetTimeout", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(checkComm(comm));
    if (!(seconds > 0 && seconds <= 1e7))
      return braid::invalidArgument(braid::strCat("seconds=", seconds, " is not in (0, 1e7]"));
    comm->comm->setTimeout(seconds);
    return Status::ok();
  });
}

braidResult_t braidCommGetTransport(braidComm_t comm, int peer, const char** transport) {
  return guard("braidCommGetTransport", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(checkComm(comm));
    if (!transport) return braid::invalidArgument("transport is NULL");
    if (peer < 0 || peer >= comm->comm->size())
      return braid::invalidArgument(
          braid::strCat("peer ", peer, " is not a rank of a communicator of ", comm->comm->size()));
    *transport = comm->comm->transportTo(peer);
    return Status::ok();
  });
}

}  // extern "C"
