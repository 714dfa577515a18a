#include "src/common/env.h"

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "src/common/byte_size.h"
#include "src/common/log.h"
#include "src/common/strcat.h"

extern char** environ;

namespace braid {
namespace {

constexpr EnvParam kParams[] = {
    {"BRAID_DEBUG", "WARN",
     "Log level: WARN, INFO (init, transports, selection) or TRACE (every call)."},
    {"BRAID_TIMEOUT", "300",
     "Seconds a call may make no progress before it returns braidTimeout (also bounds init)."},
    {"BRAID_TRANSPORT", "",
     "Force one transport for every pair of ranks: shm (ranks on one host only), ib (RDMA: "
     "InfiniBand or RoCE) or tcp."},
    {"BRAID_TUNE", "model",
     "How the algorithm of a collective is chosen where BRAID_ALGO does not force it: model (the "
     "cost model) or measure (the model's choice first, then each algorithm timed on the first "
     "calls of each size, the fastest kept)."},
    {"BRAID_ALGO", "",
     "Force algorithms per collective, e.g. allreduce=ring,broadcast=tree (names in "
     "docs/ENVIRONMENT.md)."},
    {"BRAID_SOCKET_IFNAME", "",
     "Network interface for bootstrap and TCP (exact name, e.g. eth0); default: first non-loopback "
     "interface that connects, else loopback."},
    {"BRAID_SHM_BYTES", "auto",
     "Bytes of each shared-memory ring (one per direction per pair of ranks on a host; a power of "
     "two, 4096 .. 1 TiB). auto: 1048576, or less where the host's pairs would take more than "
     "half of the room /dev/shm has."},
    {"BRAID_SHM_CMA_BYTES", "auto",
     "Messages of at least this many bytes between ranks of one host are copied once, straight "
     "from the sender's buffer (process_vm_readv), where the ranks may read each other's memory; "
     "auto: 64 KiB, or those larger than a smaller ring (BRAID_SHM_BYTES); 0 turns this off."},
    {"BRAID_SHM_BOARD", "1",
     "1: when every rank shares one host, small collectives (send buffer up to "
     "BRAID_SHM_BOARD_BYTES) and Barrier run through one shared board that every rank maps "
     "(unless BRAID_ALGO forces their algorithm); 0: through the algorithms like any call."},
    {"BRAID_SHM_BOARD_BYTES", "8192",
     "The largest send buffer, in bytes, of a collective that runs on the board (1 .. 65536); "
     "each rank has two slots of this size. Rank 0's value holds for the communicator."},
    {"BRAID_CUDA_IPC", "1",
     "1: collectives whose buffers are GPU device memory, among ranks that all share one host, "
     "move GPU to GPU through CUDA IPC and reduce on the GPU; 0: staged through host memory."},
    {"BRAID_GPU_STAGING", "pipelined",
     "How GPU buffers reach peers without CUDA IPC (other hosts, or BRAID_CUDA_IPC=0). pipelined: "
     "each message is copied through pinned host memory on the GPU's stream, its copies "
     "overlapping the wire time of the others; whole: a call's buffers are copied to host memory, "
     "the call runs on them, and the result is copied back."},
    {"BRAID_CUDA_IPC_HANDLES", "auto",
     "How cuda_ipc exports its GPU memory to the ranks of its host. fd: cuMem memory exported as "
     "a POSIX file descriptor, handed over a Unix socket; legacy: cudaMalloc memory and a legacy "
     "CUDA IPC handle; auto: fd where the driver and GPU support it, else legacy."},
    {"BRAID_CUDA_IPC_SLOT_BYTES", "auto",
     "Bytes of each of the 8 slots of GPU memory cuda_ipc keeps per peer, the "
     "unit a message crosses GPU to GPU in and the pipelining unit of GPU jobs (4096 .. 1 GiB, "
     "a multiple of 16); auto: 32 MiB."},
    {"BRAID_CUDA_IPC_DIRECT_BYTES", "auto",
     "Messages of at least this many bytes between GPU buffers of ranks on one host are read by "
     "the receiver straight out of the sender's buffer, once, rather than copied into a slot and "
     "out again. auto: buffers in braidMemAlloc memory from 64 KiB, no others. A size: also "
     "cudaMalloc buffers, from that size, and every GPU buffer must then stay allocated until "
     "every rank has destroyed the communicator. 0: every message goes through the slots."},
    {"BRAID_CUDA_IPC_CONNECT_SECONDS", "30",
     "At the first GPU call of a communicator on a CUDA stream, how long the calling thread "
     "waits for the ranks of its host to exchange and map their cuda_ipc memory, so that the "
     "mapping is made before the CUDA stream waits for the call; less where the shared-memory "
     "board shows a late rank waiting in a collective this rank has not made (0 .. 3600; 0: no "
     "wait, the mapping is made during the call)."},
    {"BRAID_IB_HCA", "",
     "RDMA devices and ports to use: mlx5_0:1,mlx5_1 (names are prefixes unless they start with "
     "=), or ^mlx5_2 to leave some out; default: the first active port."},
    {"BRAID_IB_GID_INDEX", "auto",
     "RoCE: the GID index traffic leaves from (0 .. 255); auto: the first IPv4-mapped GID."},
    {"BRAID_IB_TIMEOUT", "18",
     "RDMA: each attempt waits 4.096 us * 2^value for the peer's acknowledgement (1 .. 31)."},
    {"BRAID_IB_RETRY_CNT", "7",
     "RDMA: attempts after the first before a write fails and the peer counts as gone (0 .. 7)."},
    {"BRAID_HOSTID", "",
     "Host identity: ranks with equal values share memory (shm). Any string up to 256 bytes; "
     "default: hostname and boot id."},
    {"BRAID_TOPO_FILE", "",
     "JSON file of rank descriptions used instead of detecting the topology (docs/TOPOLOGY.md)."},
    {"BRAID_CHUNK_BYTES", "524288", "Pipelining unit of ring algorithms in bytes (4096 .. 1 GiB)."},
    {"BRAID_SPIN_US", "auto",
     "Microseconds a waiting call polls its connections, yielding the core on each pass, before "
     "it sleeps in poll(2): auto (500) or a number."},
    {"BRAID_LINK_ALPHA_US", "",
     "Cost model: microseconds per message. Unset: measured at init between ranks 0 and 1."},
    {"BRAID_LINK_GBPS", "", "Cost model: link bandwidth in GB/s. Unset: measured at init."},
    {"BRAID_REDUCE_GBPS", "", "Cost model: reduction speed in GB/s. Unset: measured at init."},
    {"BRAID_FAULTS", "",
     "Testing only: faults injected into every connection between ranks, as probabilities per "
     "message, e.g. drop=1e-4,delay=1e-3,close=1e-5,delay_ms=10,seed=7 (docs/ENVIRONMENT.md)."},
    {"BRAID_FIRST_CALL_NUMBER", "0",
     "Testing only: the number of every stream's first collective call, the same on every rank "
     "(0 .. 4294967295); near 4294967295, the calls cross the wrap of the 32-bit call numbers."},
    {"BRAID_RANK", "", "Launcher: this process's rank (with BRAID_WORLD_SIZE and BRAID_ADDR)."},
    {"BRAID_WORLD_SIZE", "", "Launcher: number of ranks."},
    {"BRAID_ADDR", "", "Launcher: host:port where rank 0 listens for the rendezvous."},
    {"BRAID_SECRET", "",
     "Launcher: 32 hex digits shared by all ranks; authenticates every connection of the job."},
};

Status parseAlgo(const std::string& text, std::map<std::string, std::string>* out) {
  size_t pos = 0;
  while (pos <= text.size() && !text.empty()) {
    size_t comma = text.find(',', pos);
    std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      return invalidArgument(strCat("BRAID_ALGO: '", item, "' is not collective=algorithm"));
    // The names are checked against the algorithm registry at init.
    (*out)[item.substr(0, eq)] = item.substr(eq + 1);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return Status::ok();
}

Status parseDouble(std::string_view name, const std::string& text, double lo, double hi,
                   double* out) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(v) || v < lo || v > hi)
    return invalidArgument(strCat(name, "='", text, "' is not a number in [", lo, ", ", hi, "]"));
  *out = v;
  return Status::ok();
}

// A size in bytes as parseByteSize reads it (digits, then K, M or G), in
// [lo, hi].
Status parseBytes(std::string_view name, const std::string& text, size_t lo, size_t hi,
                  size_t* out) {
  const std::optional<size_t> bytes = parseByteSize(text);
  if (!bytes || *bytes < lo || *bytes > hi)
    return invalidArgument(strCat(name, "='", text, "' is not a size from ", lo, " to ", hi,
                                  " bytes (digits, then K, M or G)"));
  *out = *bytes;
  return Status::ok();
}

}  // namespace

Result<FaultSpec> parseFaultSpec(const std::string& text) {
  FaultSpec spec;
  std::map<std::string, bool> seen;
  size_t pos = 0;
  while (!text.empty()) {
    const size_t comma = text.find(',', pos);
    const std::string item =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq),
                      value = eq == std::string::npos ? "" : item.substr(eq + 1);
    auto fail = [&](const std::string& why) {
      return invalidArgument(strCat("BRAID_FAULTS='", text, "': ", why,
                                    " (expected drop=P,delay=P,close=P,delay_ms=MS,seed=N)"));
    };
    if (eq == std::string::npos || key.empty() || value.empty() ||
        item.find_first_of(" \t\n") != std::string::npos)
      return fail(strCat("'", item, "' is not key=value"));
    if (seen[key]) return fail(strCat(key, " is given twice"));
    seen[key] = true;
    double* probability = key == "drop"    ? &spec.drop
                          : key == "delay" ? &spec.delay
                          : key == "close" ? &spec.close
                                           : nullptr;
    if (probability) {
      if (!parseDouble(key, value, 0, 1, probability).isOk())
        return fail(strCat(key, "=", value, " is not a probability in [0, 1]"));
    } else if (key == "delay_ms") {
      if (!parseDouble(key, value, 0.001, 60000, &spec.delayMs).isOk())
        return fail(
            strCat("delay_ms=", value, " is not a number of milliseconds in [0.001, 60000]"));
    } else if (key == "seed") {
      char* end = nullptr;
      errno = 0;
      const unsigned long long seed = std::strtoull(value.c_str(), &end, 10);
      if (errno != 0 || *end != '\0' || !std::isdigit(static_cast<unsigned char>(value[0])))
        return fail(strCat("seed=", value, " is not a non-negative integer below 2^64"));
      spec.seed = seed;
    } else {
      return fail(strCat("unknown key '", key, "'"));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (spec.drop + spec.delay + spec.close > 1)
    return invalidArgument(strCat("BRAID_FAULTS='", text,
                                  "': drop + delay + close exceed 1 (each message gets one fault "
                                  "at most)"));
  return spec;
}

std::span<const EnvParam> envParams() {
  return kParams;
}

std::string envString(std::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  return v ? std::string(v) : std::string();
}

size_t singleCopyBytes(size_t ringBytes) {
  constexpr size_t kSingleCopyBytes = 64 << 10;
  return std::min(kSingleCopyBytes, ringBytes + 1);
}

Result<Config> loadConfig() {
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    if (!entry.starts_with("BRAID_")) continue;
    std::string_view name = entry.substr(0, entry.find('='));
    bool known = false;
    for (const auto& p : kParams) known = known || p.name == name;
    if (!known)
      return invalidArgument(strCat("unknown environment variable ", name,
                                    " (docs/ENVIRONMENT.md lists every BRAID_* variable)"));
  }
  Config config;
  std::string debug = envString("BRAID_DEBUG");
  if (!debug.empty() && strcasecmp(debug.c_str(), "WARN") != 0 &&
      strcasecmp(debug.c_str(), "INFO") != 0 && strcasecmp(debug.c_str(), "TRACE") != 0)
    return invalidArgument(strCat("BRAID_DEBUG='", debug, "' is not WARN, INFO or TRACE"));
  if (std::string t = envString("BRAID_TIMEOUT"); !t.empty())
    BRAID_RETURN_IF_ERROR(parseDouble("BRAID_TIMEOUT", t, 0.001, 1e7, &config.timeoutSeconds));
  config.transport = envString("BRAID_TRANSPORT");
  if (!config.transport.empty() && config.transport != "tcp" && config.transport != "shm" &&
      config.transport != "ib")
    return invalidArgument(
        strCat("BRAID_TRANSPORT='", config.transport, "' is not a transport (shm, ib, tcp)"));
  BRAID_RETURN_IF_ERROR(parseAlgo(envString("BRAID_ALGO"), &config.algo));
  if (std::string t = envString("BRAID_TUNE"); !t.empty()) {
    if (t == "model")
      config.tune = Config::Tune::kModel;
    else if (t == "measure")
      config.tune = Config::Tune::kMeasure;
    else
      return invalidArgument(strCat("BRAID_TUNE='", t, "' is not model or measure"));
  }
  config.socketIfname = envString("BRAID_SOCKET_IFNAME");
  config.hostId = envString("BRAID_HOSTID");
  if (config.hostId.size() > 256)
    return invalidArgument(
        strCat("BRAID_HOSTID is ", config.hostId.size(), " bytes long; at most 256 are allowed"));
  config.topoFile = envString("BRAID_TOPO_FILE");
  if (std::string c = envString("BRAID_CHUNK_BYTES"); !c.empty())
    BRAID_RETURN_IF_ERROR(
        parseBytes("BRAID_CHUNK_BYTES", c, 4096, size_t{1} << 30, &config.chunkBytes));
  if (std::string b = envString("BRAID_SHM_BYTES"); !b.empty() && b != "auto") {
    config.shmRingAuto = false;
    BRAID_RETURN_IF_ERROR(
        parseBytes("BRAID_SHM_BYTES", b, 4096, size_t{1} << 40, &config.shmRingBytes));
    if ((config.shmRingBytes & (config.shmRingBytes - 1)) != 0)
      return invalidArgument(strCat("BRAID_SHM_BYTES='", b, "' is not a power of two"));
  }
  if (std::string b = envString("BRAID_SHM_CMA_BYTES"); !b.empty() && b != "auto") {
    BRAID_RETURN_IF_ERROR(
        parseBytes("BRAID_SHM_CMA_BYTES", b, 0, size_t{1} << 40, &config.shmCmaBytes));
    config.shmCmaAuto = false;
  } else {
    config.shmCmaBytes = singleCopyBytes(config.shmRingBytes);
    config.shmCmaAuto = true;
  }
  config.ibHca = envString("BRAID_IB_HCA");
  auto parseSmallInt = [](const char* name, const std::string& text, int lo, int hi,
                          int* out) -> Status {
    double v = 0;
    BRAID_RETURN_IF_ERROR(parseDouble(name, text, lo, hi, &v));
    if (v != static_cast<int>(v))
      return invalidArgument(strCat(name, "='", text, "' is not a whole number"));
    *out = static_cast<int>(v);
    return Status::ok();
  };
  if (std::string v = envString("BRAID_FIRST_CALL_NUMBER"); !v.empty()) {
    double number = 0;
    BRAID_RETURN_IF_ERROR(parseDouble("BRAID_FIRST_CALL_NUMBER", v, 0, 4294967295.0, &number));
    if (number != static_cast<double>(static_cast<uint32_t>(number)))
      return invalidArgument(strCat("BRAID_FIRST_CALL_NUMBER='", v, "' is not a whole number"));
    config.firstCallNumber = static_cast<uint32_t>(number);
  }
  if (std::string v = envString("BRAID_IB_GID_INDEX"); !v.empty() && v != "auto")
    BRAID_RETURN_IF_ERROR(parseSmallInt("BRAID_IB_GID_INDEX", v, 0, 255, &config.ibGidIndex));
  if (std::string v = envString("BRAID_IB_TIMEOUT"); !v.empty())
    BRAID_RETURN_IF_ERROR(parseSmallInt("BRAID_IB_TIMEOUT", v, 1, 31, &config.ibTimeout));
  if (std::string v = envString("BRAID_IB_RETRY_CNT"); !v.empty())
    BRAID_RETURN_IF_ERROR(parseSmallInt("BRAID_IB_RETRY_CNT", v, 0, 7, &config.ibRetryCount));
  if (std::string b = envString("BRAID_SHM_BOARD"); !b.empty()) {
    if (b != "0" && b != "1")
      return invalidArgument(strCat("BRAID_SHM_BOARD='", b, "' is neither 0 nor 1"));
    config.shmBoard = b == "1";
  }
  if (std::string b = envString("BRAID_SHM_BOARD_BYTES"); !b.empty()) {
    int bytes = 0;
    BRAID_RETURN_IF_ERROR(parseSmallInt("BRAID_SHM_BOARD_BYTES", b, 1, 65536, &bytes));
    config.shmBoardBytes = static_cast<size_t>(bytes);
  }
  if (std::string b = envString("BRAID_CUDA_IPC"); !b.empty()) {
    if (b != "0" && b != "1")
      return invalidArgument(strCat("BRAID_CUDA_IPC='", b, "' is neither 0 nor 1"));
    config.cudaIpc = b == "1";
  }
  if (std::string v = envString("BRAID_GPU_STAGING"); !v.empty()) {
    if (v != "pipelined" && v != "whole")
      return invalidArgument(strCat("BRAID_GPU_STAGING='", v, "' is neither pipelined nor whole"));
    config.gpuStagingPipelined = v == "pipelined";
  }
  if (std::string v = envString("BRAID_CUDA_IPC_HANDLES"); !v.empty()) {
    if (v == "auto")
      config.cudaIpcHandles = Config::CudaIpcHandles::kAuto;
    else if (v == "legacy")
      config.cudaIpcHandles = Config::CudaIpcHandles::kLegacy;
    else if (v == "fd")
      config.cudaIpcHandles = Config::CudaIpcHandles::kPosixFd;
    else
      return invalidArgument(
          strCat("BRAID_CUDA_IPC_HANDLES='", v, "' is none of auto, legacy and fd"));
  }
  if (std::string v = envString("BRAID_CUDA_IPC_SLOT_BYTES"); !v.empty() && v != "auto") {
    const std::optional<size_t> bytes = parseByteSize(v);
    if (!bytes || *bytes < 4096 || *bytes > (size_t{1} << 30) || *bytes % 16 != 0)
      return invalidArgument(strCat("BRAID_CUDA_IPC_SLOT_BYTES='", v,
                                    "' is not auto or a size from 4096 to 1G, a multiple of 16"));
    config.cudaIpcSlotBytes = *bytes;
  }
  if (std::string v = envString("BRAID_CUDA_IPC_DIRECT_BYTES"); !v.empty() && v != "auto") {
    const std::optional<size_t> bytes = parseByteSize(v);
    if (!bytes || *bytes > (size_t{1} << 40))
      return invalidArgument(
          strCat("BRAID_CUDA_IPC_DIRECT_BYTES='", v,
                 "' is not auto or a size of at most 1024G (0: never read in place)"));
    config.cudaIpcDirectBytes = *bytes;
    config.cudaIpcHeldDirectBytes = *bytes;
  }
  if (std::string v = envString("BRAID_CUDA_IPC_CONNECT_SECONDS"); !v.empty())
    BRAID_RETURN_IF_ERROR(
        parseDouble("BRAID_CUDA_IPC_CONNECT_SECONDS", v, 0, 3600, &config.cudaIpcConnectSeconds));
  if (std::string v = envString("BRAID_LINK_ALPHA_US"); !v.empty())
    BRAID_RETURN_IF_ERROR(
        parseDouble("BRAID_LINK_ALPHA_US", v, 0.01, 1e7, &config.linkAlphaMicroseconds));
  if (std::string v = envString("BRAID_LINK_GBPS"); !v.empty())
    BRAID_RETURN_IF_ERROR(
        parseDouble("BRAID_LINK_GBPS", v, 1e-4, 1e5, &config.linkGigabytesPerSecond));
  if (std::string v = envString("BRAID_REDUCE_GBPS"); !v.empty())
    BRAID_RETURN_IF_ERROR(
        parseDouble("BRAID_REDUCE_GBPS", v, 1e-4, 1e5, &config.reduceGigabytesPerSecond));
  if (std::string spin = envString("BRAID_SPIN_US"); !spin.empty() && spin != "auto")
    BRAID_RETURN_IF_ERROR(parseDouble("BRAID_SPIN_US", spin, 0, 1e6, &config.spinMicroseconds));
  BRAID_ASSIGN_OR_RETURN(config.faults, parseFaultSpec(envString("BRAID_FAULTS")));
  static std::atomic<bool> faultsAnnounced{false};
  if (config.faults.enabled() && !faultsAnnounced.exchange(true))
    BRAID_WARN(
        "BRAID_FAULTS is set: connections between ranks drop, delay and cut messages on "
        "purpose (drop=",
        config.faults.drop, ", delay=", config.faults.delay, ", close=", config.faults.close,
        ", seed=", config.faults.seed, ")");
  return config;
}

}  // namespace braid
