#include "src/gpu_path.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "braid_config.h"
#include "src/common/log.h"
#include "src/common/strcat.h"
#include "src/cuda_stream.h"
#include "src/steadily_waiting.h"
#include "transports/cuda_ipc/cuda_ipc_connection.h"
#include "transports/cuda_ipc/driver_ipc_device.h"
#include "transports/cuda_ipc/ipc_or_fallback.h"
#include "transports/gpu_staged/staged_connection.h"
#ifdef BRAID_HAVE_CUDA
#include "src/cuda/device_reduce.h"
#endif

namespace braid {
namespace {

#ifdef BRAID_HAVE_CUDA
// Combiner::applyOnDevice for a job's reductions: its datatype and op, the
// local operand first or the incoming one, on the device's stream.
Status reduceOnGpu(void* dst, const void* local, const void* incoming, size_t units,
                   const void* context, void* stream) {
  const Job& job = *static_cast<const Job*>(context);
  return cuda::reduceOnDevice(dst, local, incoming, units, job.dtype, job.op, stream);
}
Status reduceIncomingFirstOnGpu(void* dst, const void* local, const void* incoming, size_t units,
                                const void* context, void* stream) {
  const Job& job = *static_cast<const Job*>(context);
  return cuda::reduceOnDevice(dst, incoming, local, units, job.dtype, job.op, stream);
}
Status averageOnGpu(void* dst, const void* local, const void*, size_t units, const void* context,
                    void* stream) {
  const Job& job = *static_cast<const Job*>(context);
  if (dst != local)
    BRAID_RETURN_IF_ERROR(cuda::copyOnDevice(dst, local, units * dataTypeSize(job.dtype), stream));
  return cuda::averageOnDevice(dst, units, job.dtype, job.nranks, stream);
}
#endif

}  // namespace

void loadGpuKernels() {
#ifdef BRAID_HAVE_CUDA
  Result<int> kernels = cuda::loadKernels();
  if (kernels.isOk())
    BRAID_TRACE("loaded ", *kernels, " GPU kernels");
  else  // not the caller's failure: a launch that cannot load its kernel says why
    BRAID_INFO("braid's GPU kernels are not loaded: ", kernels.status().message());
#endif
}

size_t gpuChunkBytes(size_t configuredSlotBytes) {
  return configuredSlotBytes > 0 ? configuredSlotBytes : kDefaultCudaIpcSlotBytes;
}

std::string sharedGpuWarning(int rank, int ranksOnHost, int nvidiaGpusOnHost,
                             std::optional<bool> mps) {
  if (nvidiaGpusOnHost <= 0 || ranksOnHost <= nvidiaGpusOnHost || mps.value_or(false)) return "";
  return strCat("rank ", rank, ": ", ranksOnHost, " ranks of this host share its ",
                nvidiaGpusOnHost, " NVIDIA GPU", nvidiaGpusOnHost > 1 ? "s" : "",
                mps ? ", and MPS is off" : ", and the driver does not say whether MPS is on",
                ": processes that share a GPU take turns on it, and every chunk of a GPU call "
                "handed between two of them waits for a turn (about 200 us on an H200), so those "
                "calls run far below the GPU's bandwidth. Start MPS (nvidia-cuda-mps-control -d) "
                "before the ranks, or give each rank a GPU of its own (docs/GPU.md)");
}

bool GpuPath::built() {
#ifdef BRAID_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Result<std::unique_ptr<GpuPath>> GpuPath::create(int rank, int deviceOrdinal,
                                                 std::span<transport::Connection* const> host,
                                                 const std::vector<bool>& ipc,
                                                 const Config& config) {
  if (!built()) return notSupported("this build of braid moves host memory only");
  std::unique_ptr<GpuPath> path(new GpuPath);
  path->deviceOrdinal_ = deviceOrdinal;
  using Handles = transport::cuda_ipc::DriverIpcDevice::Handles;
  const Config::CudaIpcHandles handles = config.cudaIpcHandles;
  const Handles exports = handles == Config::CudaIpcHandles::kLegacy    ? Handles::kLegacy
                          : handles == Config::CudaIpcHandles::kPosixFd ? Handles::kPosixFd
                                                                        : Handles::kAuto;
  BRAID_ASSIGN_OR_RETURN(auto device,
                         transport::cuda_ipc::DriverIpcDevice::create(deviceOrdinal, exports));
  // A wait for the GPU that never ends (a peer gone mid-call) fails the
  // call, as any other wait does, rather than hang it.
  device->setSynchronizeLimit(config.timeoutSeconds);
  // Loaded now, before a CUDA stream waits for a call of this communicator.
  (void)device->runInContext("loading braid's kernels", [] {
    loadGpuKernels();
    return Status::ok();
  });
  path->device_ = std::move(device);
  transport::cuda_ipc::CudaIpcConnection::Options options;
  options.slotBytes = gpuChunkBytes(config.cudaIpcSlotBytes);
  options.directMinBytes = config.cudaIpcDirectBytes;
  options.heldDirectMinBytes = config.cudaIpcHeldDirectBytes;
  // Not while a CUDA stream may wait for a call: opening a peer's
  // allocation takes the driver's memory lock (docs/GPU.md).
  options.ifMayMap = CudaStreamBridge::ifNoGateHeld;
  transport::gpu_staged::StagedConnection::Options staged;
  staged.minBounceBytes = config.chunkBytes;
  for (size_t p = 0; p < host.size(); ++p) {
    if (static_cast<int>(p) == rank) {
      path->connections_.push_back(host[p]);
      path->stagedConnections_.push_back(host[p]);
      continue;
    }
    auto stagedTo =
        std::make_unique<transport::gpu_staged::StagedConnection>(*host[p], path->device_, staged);
    path->stagedConnections_.push_back(stagedTo.get());
    if (ipc[p]) {
      BRAID_ASSIGN_OR_RETURN(auto connection,
                             transport::cuda_ipc::CudaIpcConnection::createShared(
                                 *host[p], kCudaIpcChannel, path->device_, options));
      // Where the two cannot map each other's memory, this pair's messages
      // go through pinned memory instead; whole, as the plans of the other
      // pairs (the same on every rank) do not cut them into pieces.
      auto chosen =
          std::make_unique<transport::cuda_ipc::IpcOrFallback>(std::move(connection), *stagedTo);
      path->connections_.push_back(chosen.get());
      path->ipcPairs_.push_back(chosen.get());
      path->owned_.push_back(std::move(chosen));
    } else {
      path->connections_.push_back(stagedTo.get());
      path->hasStagedPeers_ = true;
    }
    path->owned_.push_back(std::move(stagedTo));
  }
  return path;
}

std::optional<bool> GpuPath::sharedThroughMps() const {
  return device_->sharedThroughMps();
}

GpuPath::~GpuPath() {
  // The connections' queued copies end before their memory goes (each
  // synchronizes); the scratch is freed after them.
  owned_.clear();
  (void)device_->synchronize();
}

DeviceWork GpuPath::work() const {
  DeviceWork w;
  w.device = device_.get();
#ifdef BRAID_HAVE_CUDA
  w.reduce = &reduceOnGpu;
  w.reduceIncomingFirst = &reduceIncomingFirstOnGpu;
  w.average = &averageOnGpu;
#endif
  return w;
}

void GpuPath::settleHandshakes(double seconds,
                               const std::function<std::vector<bool>()>& ranksBusyElsewhere) {
  if (ipcPairs_.empty() || seconds <= 0 || handshakesSettled_.load(std::memory_order_acquire))
    return;
  // A first GPU call on another thread waits for this one's wait to end:
  // returning at once, its call would map the late peers while its stream
  // waits.
  std::lock_guard lock(settleMutex_);
  if (handshakesSettled_.load(std::memory_order_relaxed)) return;
  struct SettledOnReturn {
    std::atomic<bool>& settled;
    ~SettledOnReturn() { settled.store(true, std::memory_order_release); }
  } settledOnReturn{handshakesSettled_};
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  auto elapsed = [start] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  SteadilyWaiting busy(kSteadilyBusySeconds);
  double lookedAt = -1;
  for (;;) {
    bool moved = false;
    std::vector<int> late;  // the peers of the pairs still undecided
    for (transport::cuda_ipc::IpcOrFallback* pair : ipcPairs_) {
      if (pair->decided()) continue;
      // A failure is the calls' to report; the pair has decided then.
      Result<bool> progressed = pair->progress();
      moved = moved || (progressed.isOk() && *progressed);
      if (!pair->decided()) late.push_back(pair->peer());
    }
    if (late.empty()) return;
    const double waited = elapsed();
    // A late peer is waited for, as the call would wait for it; one that
    // waits in another call instead (the calls differ, or this rank makes
    // that one later) is not, once this rank's own calls before this one
    // had a moment to be announced, while it steadily waits there. The wait
    // ends when every late peer does.
    if (ranksBusyElsewhere && waited >= kAnnouncedWithinSeconds &&
        waited - lookedAt >= kBusyLookSeconds) {
      busy.look(ranksBusyElsewhere(), waited);
      lookedAt = waited;
    }
    if (std::ranges::all_of(late, [&](int peer) { return busy.steadily(peer, waited); })) {
      for (const int peer : late)
        BRAID_INFO("cuda_ipc: rank ", peer,
                   " waits, through its calls, for a later call of this rank; its memory is "
                   "mapped during the first call");
      return;
    }
    if (waited >= seconds) {
      BRAID_INFO("cuda_ipc: rank ", late.front(),
                 late.size() > 1 ? strCat(" and ", late.size() - 1, " more") : "",
                 " of this host did not reach a first GPU call within ", seconds,
                 " s (BRAID_CUDA_IPC_CONNECT_SECONDS); their memory is mapped during the first "
                 "call");
      return;
    }
    // The peers answer within microseconds once they reach their first GPU call.
    if (!moved) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void GpuPath::exportForReadsInPlace(const void* data, size_t bytes) {
  if (data != nullptr && bytes > 0) (void)device_->exportRange(data, bytes);
}

Result<uint8_t*> GpuPath::scratch(int stream, int nth, size_t bytes) {
  std::lock_guard lock(scratchMutex_);
  Scratch& mine = scratch_[{stream, nth}];
  if (!mine.memory || mine.bytes < bytes) {
    // The old memory may still be in use: a call on a CUDA stream grows
    // its scratch on the caller's thread (Communicator::prepareGpuCalls)
    // while the stream's previous call runs. So it is freed only with the
    // path, which also keeps frees out of calls: freeing GPU memory waits
    // for the whole GPU, which a CUDA stream waiting for a call may hold.
    // Growth doubles, so little is kept.
    BRAID_ASSIGN_OR_RETURN(auto grown, device_->allocateUnshared(std::max(bytes, 2 * mine.bytes)));
    if (mine.memory) retired_.push_back(std::move(mine.memory));
    mine.memory = std::move(grown);
    mine.bytes = std::max(bytes, 2 * mine.bytes);
  }
  return static_cast<uint8_t*>(mine.memory->data());
}

}  // namespace braid
