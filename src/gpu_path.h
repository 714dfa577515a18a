// Collectives whose buffers are GPU memory: run by the progress engine as
// GPU jobs (Job::gpu), with every local step and reduction on the GPU.
// Peers of the same host are reached over cuda_ipc connections, so the
// bytes go from GPU to GPU, never through host memory; two or more
// processes on one GPU work alike (each maps the others' slots; no kernel
// waits for another process). A pair whose ends cannot map each other's
// memory (GPUs without peer access, processes the driver keeps apart)
// learns so in the cuda_ipc handshake and falls back to gpu_staged, both
// ends alike (transports/cuda_ipc/ipc_or_fallback.h). Other peers (other
// hosts, or where cuda_ipc is off) are reached over gpu_staged
// connections: each message copied
// through pinned host memory on the GPU's stream and carried by the host
// connection, the copies of one message overlapping the wire time of the
// others.
//
// One per communicator and GPU, made at the first such call: it opens the
// GPU's primary context with a stream of its own, and a connection to
// every peer that shares the host connection to it (cuda_ipc records in
// channel kCudaIpcChannel; gpu_staged messages under the call's own tags),
// and a gpu_staged one to each peer for Send/Recv.
// The cuda_ipc handshakes complete as the first call progresses.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "src/common/env.h"
#include "src/progress.h"
#include "transports/transport.h"

namespace braid {
namespace transport::cuda_ipc {
class IpcOrFallback;
}

// The tag channel of the cuda_ipc records on a host connection: the
// point-to-point channel of the pair probe's stream, which only ever runs
// collectives (src/communicator.cc checks the two agree). Every other
// channel below StreamConnection's own (0xff) is some stream's.
inline constexpr uint8_t kCudaIpcChannel = 0xfd;

// Loads braid's GPU kernels into the context current on this thread, where
// this build has them (src/cuda/device_reduce.h: loadKernels). Called
// before any CUDA stream can wait for a call: a kernel loaded at its first
// launch may wait for the whole context, which such a stream holds.
void loadGpuKernels();

// The unit a GPU job's messages cross GPU to GPU in, and the pipelining unit
// of its schedule: BRAID_CUDA_IPC_SLOT_BYTES, or by default 32 MiB. Every
// handoff of a chunk between two processes that take turns on one GPU (no
// MPS) costs a switch of the GPU between them, about 200 us on an H200, so
// chunks far larger than the host's (BRAID_CHUNK_BYTES) pay: AllReduce of
// 1 GiB between two processes on one H200 ran at 8 GB/s in 512 KiB chunks
// and at 218 GB/s in 32 MiB ones, 8 slots each (docs/PERFORMANCE.md). Only
// GPU jobs among the ranks of one host pipeline so (Communicator::planArgs);
// between hosts the wire sets the pace and BRAID_CHUNK_BYTES still does.
size_t gpuChunkBytes(size_t configuredSlotBytes);

// What to tell the user when more ranks share a host than it has NVIDIA GPUs
// (so some share a GPU) and MPS is not known to be on: those processes take
// turns on their GPU, and their GPU calls run far below its bandwidth. ""
// when there is nothing to tell. `mps`: whether the GPU is shared through
// MPS, nothing when the driver does not say.
std::string sharedGpuWarning(int rank, int ranksOnHost, int nvidiaGpusOnHost,
                             std::optional<bool> mps);

class GpuPath {
 public:
  // Whether this build runs collectives on GPU memory this way (a CUDA build).
  static bool built();

  // `host[p]` is the host connection to rank p (outlives the path); the own
  // rank's entry stands in for its own place in connections(). `ipc[p]`:
  // whether rank p is reached over cuda_ipc (else gpu_staged). From
  // `config`: chunkBytes sizes the smallest bounce buffers, and the
  // cudaIpc* settings cuda_ipc's slots, handles and reads in place.
  static Result<std::unique_ptr<GpuPath>> create(int rank, int deviceOrdinal,
                                                 std::span<transport::Connection* const> host,
                                                 const std::vector<bool>& ipc,
                                                 const Config& config);
  ~GpuPath();

  int deviceOrdinal() const { return deviceOrdinal_; }
  // Whether the GPU is shared through MPS; nothing when the driver does not say.
  std::optional<bool> sharedThroughMps() const;
  // Whether some peer is reached over gpu_staged by configuration (the same
  // on every rank: all share one host with cuda_ipc on, or not), not
  // counting pairs that fell back from cuda_ipc, which only they know of.
  bool hasStagedPeers() const { return hasStagedPeers_; }
  // By rank: cuda_ipc connections, and the own rank's host entry.
  std::span<transport::Connection* const> connections() const { return connections_; }
  // By rank: gpu_staged connections to every peer, those reached over
  // cuda_ipc too, for Send/Recv (whose other end may hold host memory).
  std::span<transport::Connection* const> stagedConnections() const { return stagedConnections_; }
  // The device and its reductions, for a job's gpu field.
  DeviceWork work() const;
  // Exports the allocation holding [data, data + bytes) for its peers to read
  // in place (BRAID_CUDA_IPC_DIRECT_BYTES), before a CUDA stream waits for
  // the call, when exporting may not be done (docs/GPU.md); memory that
  // cannot be exported is left to the slots.
  void exportForReadsInPlace(const void* data, size_t bytes);
  // GPU memory of at least `bytes` for the scratch of the `nth` GPU job of
  // each batch on `stream` (each stream its own: their calls may run at
  // once; and each job of a group its own).
  Result<uint8_t*> scratch(int stream, int nth, size_t bytes);
  // Progresses the cuda_ipc handshakes with the peers of this host until
  // every pair has decided (mapped, fallen back, or broken), on the calling
  // thread; only the first time it is asked, other threads waiting until
  // that ends. Mapping a peer's memory takes the driver's memory lock, so
  // the first call on a CUDA stream has it done before the stream waits.
  // Gives up after `seconds` (no wait for 0), or once every peer still
  // undecided is one that `ranksBusyElsewhere` (where given; by rank) says
  // waits in another call, which it would not leave for this rank's.
  void settleHandshakes(double seconds,
                        const std::function<std::vector<bool>()>& ranksBusyElsewhere);
  bool handshakesSettled() const { return handshakesSettled_.load(std::memory_order_acquire); }

 private:
  GpuPath() = default;

  int deviceOrdinal_ = -1;
  bool hasStagedPeers_ = false;
  std::shared_ptr<transport::cuda_ipc::IpcDevice> device_;
  std::vector<std::unique_ptr<transport::Connection>> owned_;
  std::vector<transport::Connection*> connections_;
  std::vector<transport::Connection*> stagedConnections_;
  std::vector<transport::cuda_ipc::IpcOrFallback*> ipcPairs_;
  std::atomic<bool> handshakesSettled_{false};
  std::mutex settleMutex_;  // held by the thread that settles them
  // How long this rank's own calls made before its first GPU call may take
  // to be announced on the board (by their stream's thread), before a peer
  // that seems to wait in a call this rank has not made is believed.
  static constexpr double kAnnouncedWithinSeconds = 0.5;
  // How often the wait asks which peers are busy elsewhere: each look reads
  // every rank's announcements and counts.
  static constexpr double kBusyLookSeconds = 0.01;
  // How long every look must show a peer busy elsewhere before the wait
  // looks past it (SteadilyWaiting).
  static constexpr double kSteadilyBusySeconds = 0.05;
  struct Scratch {
    size_t bytes = 0;
    std::unique_ptr<transport::cuda_ipc::DeviceMemory> memory;
  };
  std::mutex scratchMutex_;
  std::map<std::pair<int, int>, Scratch> scratch_;  // by stream and nth
  std::vector<std::unique_ptr<transport::cuda_ipc::DeviceMemory>> retired_;
};

}  // namespace braid
