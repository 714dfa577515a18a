// Every BRAID_* environment variable, declared once with its default and
// documentation, and parsed once per communicator into an immutable Config.
// A BRAID_* variable that is not in the table, or whose value does not
// parse, is an error at init: nothing is silently ignored.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "src/common/status.h"

namespace braid {

struct EnvParam {
  std::string_view name;
  std::string_view defaultValue;  // "" = unset
  std::string_view doc;
};

// The registered variables, in documentation order.
std::span<const EnvParam> envParams();

// BRAID_FAULTS: faults injected into every connection between two ranks, for
// testing how braid fails (transports/faulty). Probabilities are per message
// sent; all zero (the default) injects nothing and costs nothing.
struct FaultSpec {
  double drop = 0;      // never delivered, or only its first bytes (its send completes)
  double delay = 0;     // the message is held back up to delayMs
  double close = 0;     // the connection is cut while the message is written
  double delayMs = 10;  // longest hold of a delayed message
  uint64_t seed = 0;    // the same seed draws the same faults
  bool enabled() const { return drop > 0 || delay > 0 || close > 0; }
};

// Parses "drop=1e-4,delay=1e-3,close=1e-5,delay_ms=10,seed=7": every key at
// most once, nothing else; "" is no faults.
Result<FaultSpec> parseFaultSpec(const std::string& text);

// BRAID_CUDA_IPC_SLOT_BYTES=auto (src/gpu_path.h, gpuChunkBytes, says why).
inline constexpr size_t kDefaultCudaIpcSlotBytes = size_t{32} << 20;
// Where messages from braidMemAlloc memory start being read in place, by
// default: a read in place costs a handoff each way, as a slot does, and
// saves a copy of the message, which at 64 KiB is a small part of a GPU
// call's time whichever way it goes.
inline constexpr size_t kDefaultCudaIpcHeldDirectBytes = size_t{64} << 10;

struct Config {
  double timeoutSeconds = 300;  // BRAID_TIMEOUT
  std::string transport;        // BRAID_TRANSPORT ("" = automatic)
  // BRAID_TUNE: how the algorithm of a call is chosen where BRAID_ALGO does
  // not force it (docs/ENVIRONMENT.md).
  enum class Tune { kModel, kMeasure };
  Tune tune = Tune::kModel;
  std::map<std::string, std::string> algo;  // BRAID_ALGO: collective -> algorithm
  std::string socketIfname;                 // BRAID_SOCKET_IFNAME
  std::string hostId;                       // BRAID_HOSTID ("" = hostname and boot id)
  std::string topoFile;                     // BRAID_TOPO_FILE ("" = detect)
  size_t chunkBytes = 1 << 19;              // BRAID_CHUNK_BYTES: pipelining unit
  size_t shmRingBytes = 1 << 20;            // BRAID_SHM_BYTES: each shared-memory ring
  size_t shmCmaBytes = 64 << 10;            // BRAID_SHM_CMA_BYTES: single copy (0 = off)
  bool shmCmaAuto = true;                   // BRAID_SHM_CMA_BYTES unset or auto
  bool shmRingAuto = true;                  // BRAID_SHM_BYTES unset or auto: fitted to /dev/shm
  double spinMicroseconds = -1;             // BRAID_SPIN_US (-1 = automatic)
  // InfiniBand/RoCE (docs/ENVIRONMENT.md); checked when the transport starts.
  std::string ibHca;            // BRAID_IB_HCA ("" = every device)
  int ibGidIndex = -1;          // BRAID_IB_GID_INDEX (-1 = chosen)
  int ibTimeout = 18;           // BRAID_IB_TIMEOUT: 4.096 us * 2^value per attempt
  int ibRetryCount = 7;         // BRAID_IB_RETRY_CNT
  bool shmBoard = true;         // BRAID_SHM_BOARD: small collectives and Barrier through one board
  size_t shmBoardBytes = 8192;  // BRAID_SHM_BOARD_BYTES: the largest send buffer on the board
  bool cudaIpc = true;  // BRAID_CUDA_IPC: GPU buffers GPU to GPU among the ranks of one host
  // BRAID_GPU_STAGING=pipelined: GPU buffers reach peers without cuda_ipc
  // message by message through pinned host memory (whole: a call's buffers
  // are copied to host memory and back).
  bool gpuStagingPipelined = true;
  // BRAID_CUDA_IPC_HANDLES: how cuda_ipc exports its GPU memory to peers.
  enum class CudaIpcHandles { kAuto, kLegacy, kPosixFd };
  CudaIpcHandles cudaIpcHandles = CudaIpcHandles::kAuto;
  // BRAID_CUDA_IPC_SLOT_BYTES: each cuda_ipc slot, and the pipelining unit
  // of GPU jobs among the ranks of one host; 0 = kDefaultCudaIpcSlotBytes.
  // Alike on every rank (agreed_settings.h).
  size_t cudaIpcSlotBytes = 0;
  // BRAID_CUDA_IPC_DIRECT_BYTES: messages of at least this many bytes are
  // read by the receiver in the sender's buffer (cuda_ipc_connection.h).
  // cudaIpcDirectBytes for any buffer the device can export: 0 = never, the
  // default, since peers keep the sender's allocations open, and CUDA
  // leaves undefined a cudaMalloc allocation freed while another process
  // has it open; so it is for programs whose GPU buffers outlive the
  // communicator. cudaIpcHeldDirectBytes for braidMemAlloc's memory, which
  // a peer's mapping keeps alive (shared_gpu_memory.h). A size sets both;
  // 0 both to never. Ranks may differ: each end sends as it is set.
  size_t cudaIpcDirectBytes = 0;
  size_t cudaIpcHeldDirectBytes = kDefaultCudaIpcHeldDirectBytes;
  // BRAID_CUDA_IPC_CONNECT_SECONDS: how long the first GPU call on a CUDA
  // stream waits for the cuda_ipc handshakes (GpuPath::settleHandshakes).
  double cudaIpcConnectSeconds = 30;
  // Cost model figures; 0 = measured at init.
  double linkAlphaMicroseconds = 0;     // BRAID_LINK_ALPHA_US
  double linkGigabytesPerSecond = 0;    // BRAID_LINK_GBPS
  double reduceGigabytesPerSecond = 0;  // BRAID_REDUCE_GBPS
  FaultSpec faults;                     // BRAID_FAULTS (none by default)
  uint32_t firstCallNumber = 0;         // BRAID_FIRST_CALL_NUMBER (testing only)
};

// Reads the environment, validates every BRAID_* variable present.
Result<Config> loadConfig();

// BRAID_SHM_CMA_BYTES=auto: the smallest message between two ranks of one
// host that is copied once (process_vm_readv, and process_vm_writev by the
// sender for the second half of a large one) rather than through a ring of
// `ringBytes`: 64 KiB, or a message larger than a smaller ring. Through the
// rings a sender completes at once and runs ahead, so a receiver that comes
// later takes each message into memory of its own and copies it a second
// time (docs/PERFORMANCE.md: 2 ranks, 64 KiB to 1 MiB, Broadcast 4-20x,
// SendRecv, AllGather, ReduceScatter and AllToAll 1.5-2x faster this way).
size_t singleCopyBytes(size_t ringBytes);

// Reads one variable ("" when unset). Only bootstrap and the logger call it.
std::string envString(std::string_view name);

}  // namespace braid
