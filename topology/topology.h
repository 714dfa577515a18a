// Where ranks are relative to each other, and what connects them.
//
// Each rank describes itself with a RankTopology (host, NUMA node, bound
// cores, GPUs and NICs). The descriptions are exchanged at init, encoded with
// RankTopology::encode(); every rank then computes the same TransportMatrix
// from the same table, so both ends of a pair agree on its transport without
// further negotiation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/common/env.h"
#include "src/common/status.h"

namespace braid::topo {

enum class DeviceKind : uint8_t { kGpu, kEthernet, kInfiniband };
std::string_view deviceKindName(DeviceKind kind);  // "gpu", "eth", "ib"

// A PCI function that matters for communication.
struct PciDevice {
  DeviceKind kind = DeviceKind::kGpu;
  std::string busId;  // "0000:3b:00.0"
  uint16_t vendor = 0;
  uint16_t device = 0;
  int numaNode = -1;                  // -1: unknown (single-node machine, or firmware is silent)
  std::vector<std::string> netNames;  // network interfaces on it: eth0, ib0
  std::vector<std::string> ibNames;   // verbs devices on it: mlx5_0 (also RoCE Ethernet NICs)
  // NVIDIA GPUs: the UUID the driver reports ("GPU-8f6c2e1a-..."), which names
  // the physical GPU whatever CUDA_VISIBLE_DEVICES makes of its index; "" when
  // the driver is not loaded or the GPU is another maker's.
  std::string uuid;

  bool operator==(const PciDevice&) const = default;
};

inline constexpr uint16_t kNvidiaVendor = 0x10de;

// What a PCI function of this class code (24 bits) and vendor is to braid,
// or nothing when it does not matter for communication.
std::optional<DeviceKind> pciDeviceKind(uint32_t classCode, uint16_t vendor);

// Sort key of device lists: GPUs, then verbs-capable NICs, then Ethernet.
int deviceOrder(const PciDevice& device);

// The "GPU UUID:" line of the NVIDIA driver's description of one GPU
// (/proc/driver/nvidia/gpus/<bus id>/information), "" when it has none.
std::string nvidiaGpuUuid(std::string_view information);

// Transports that a rank may use besides tcp, which is always possible.
struct TransportSet {
  bool cudaIpc = true;
  bool shm = true;
  bool ib = true;

  bool operator==(const TransportSet&) const = default;
};

struct RankTopology {
  std::string hostname;
  // Equal for processes that share memory: BRAID_HOSTID, else
  // "<hostname>/<boot id>" (the boot id alone is shared by containers on one
  // kernel, which need not share /dev/shm).
  std::string hostId;
  int pid = 0;
  // The NUMA node holding all of `cores`; -1 when they span several nodes or
  // the machine does not say.
  int numaNode = -1;
  std::vector<int> cores;          // logical CPUs this process may run on, ascending
  std::vector<PciDevice> devices;  // GPUs first, then InfiniBand, then Ethernet
  // What this process can use; the caller narrows it before encoding (e.g.
  // cudaIpc off when no CUDA device could be opened). A pair uses a
  // transport only if both ranks allow it.
  TransportSet transports;

  bool hasNvidiaGpu() const { return nvidiaGpuCount() > 0; }
  int nvidiaGpuCount() const;
  bool hasIbDevice() const;  // a verbs device, InfiniBand or RoCE

  // Compact single-line text. At most kMaxEncodedBytes when the strings are
  // at most 256 bytes, as detect(), BRAID_HOSTID and topology files ensure:
  // a description that would be longer loses its Ethernet devices first,
  // with a warning.
  std::string encode() const;
  // Accepts encode()'s output, also followed by NUL padding (a fixed-size
  // slot of an AllGather). Anything else is an error, never a crash.
  static Result<RankTopology> decode(std::string_view text);

  // One line: host, pid, NUMA node, cores, device counts.
  std::string summary() const;

  bool operator==(const RankTopology&) const = default;
};

inline constexpr size_t kMaxEncodedBytes = 4096;

struct DetectOptions {
  std::string hostId;    // "" = hostname and boot id
  bool useHwloc = true;  // ignored in builds without hwloc (then /sys)
};

// This process, read from /proc, /sys and the scheduler (through hwloc when
// built with it). Never fails: what cannot be read stays unknown.
RankTopology detect(const DetectOptions& options = {});

// "0-3,8,10-11" <-> {0,1,2,3,8,10,11}, the kernel's cpulist format.
std::string formatCpuList(std::span<const int> cpus);
Result<std::vector<int>> parseCpuList(std::string_view text);

// BRAID_TOPO_FILE: a JSON array of rank descriptions (index = rank), an
// object whose "ranks" member is such an array (braid-topo --json output),
// or a single description that every rank takes. See docs/TOPOLOGY.md.
struct TopologyFile {
  std::vector<RankTopology> ranks;
  bool shared = false;  // one description for every rank

  // The description of `rank`; an error unless the file lists exactly
  // `numRanks` ranks or is shared. numRanks <= 0 skips that check.
  Result<RankTopology> entry(int rank, int numRanks) const;
};
Result<TopologyFile> parseTopologyJson(std::string_view text);
Result<TopologyFile> loadTopologyFile(const std::string& path);

// This process's description: its entry of BRAID_TOPO_FILE when
// config.topoFile is set, else detected (with config.hostId).
Result<RankTopology> localTopology(const Config& config, int rank, int numRanks);

std::string toJson(const RankTopology& rank, int indent = -1);
Result<RankTopology> rankFromJson(std::string_view text);

enum class LinkKind : uint8_t {
  kSelf,
  kSameNuma,   // one host, both ranks bound within the same NUMA node
  kCrossNuma,  // one host, bound to different NUMA nodes
  kSameHost,   // one host, NUMA placement unknown or spanning nodes
  kNetwork,
};
std::string_view linkKindName(LinkKind kind);  // "self", "same-numa", ...
bool isSameHost(LinkKind kind);                // kSelf excluded

LinkKind classify(std::span<const RankTopology> ranks, int a, int b);

// kSelf for a == b; the others in priority order: a pair gets the first that
// is available and reaches.
enum class Transport : uint8_t { kSelf, kCudaIpc, kShm, kIb, kTcp };
std::string_view transportName(Transport transport);  // "self", "cuda_ipc", "shm", "ib", "tcp"
// A name that BRAID_TRANSPORT may force ("self" is not one). The error lists
// the known names.
Result<Transport> parseTransport(std::string_view name);

// Per rank, how many ranks share its host and how many logical CPUs they
// may run on, all of them together: ranks pinned to one core each share
// none, however few each has, while unpinned ranks share the same ones.
struct HostShare {
  int ranks = 0;
  int cores = 0;
  int nvidiaGpus = 0;  // the most any rank of the host lists
};
std::vector<HostShare> hostShares(std::span<const RankTopology> ranks);

struct Link {
  LinkKind kind = LinkKind::kSelf;
  Transport transport = Transport::kSelf;
  bool operator==(const Link&) const = default;
};

// The transport of (a, b). `available` is what this build offers and must be
// equal on every rank; per-process differences belong in each rank's
// `transports`. The result depends only on the unordered pair, so a and b
// compute the same. `forced` ("" = automatic) is BRAID_TRANSPORT: a name that
// is unknown, or a transport that is unavailable or cannot reach the pair,
// is an error naming the pair and the reason.
Result<Link> chooseLink(std::span<const RankTopology> ranks, int a, int b,
                        const TransportSet& available, std::string_view forced = {});

class TransportMatrix {
 public:
  TransportMatrix() = default;
  explicit TransportMatrix(int numRanks)
      : numRanks_(numRanks), links_(static_cast<size_t>(numRanks) * numRanks) {}

  int size() const { return numRanks_; }
  const Link& at(int a, int b) const { return links_[static_cast<size_t>(a) * numRanks_ + b]; }
  Link& at(int a, int b) { return links_[static_cast<size_t>(a) * numRanks_ + b]; }

  // Two grids (transport, link kind), rows are a, columns b.
  std::string toText() const;
  // {"transport": [[...]], "link": [[...]]}, names as above.
  std::string toJson(int indent = -1) const;

 private:
  int numRanks_ = 0;
  std::vector<Link> links_;
};

// Every pair; the first pair that fails (in row order) is the error.
Result<TransportMatrix> chooseTransports(std::span<const RankTopology> ranks,
                                         const TransportSet& available,
                                         std::string_view forced = {});

}  // namespace braid::topo
