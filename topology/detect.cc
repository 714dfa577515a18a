// Detection runs at every communicator init, so it reads a few small sysfs
// files with plain syscalls and asks hwloc for no more than the cores and
// NUMA nodes.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "src/common/log.h"
#include "src/common/strcat.h"
#include "topology/topology.h"

#if BRAID_TOPOLOGY_HWLOC
#include <hwloc.h>
#endif

namespace braid::topo {
namespace {

constexpr const char* kPciRoot = "/sys/bus/pci/devices";
constexpr const char* kNodeRoot = "/sys/devices/system/node";
constexpr const char* kNvidiaGpuRoot = "/proc/driver/nvidia/gpus";

// "" when missing; the trailing newline of sysfs files is dropped.
std::string readSmall(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[4096];
  ssize_t n;
  do {
    n = ::read(fd, buf, sizeof(buf));
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n <= 0) return "";
  std::string text(buf, static_cast<size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return names;
  while (dirent* entry = ::readdir(dir)) {
    std::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

long parseNumber(const std::string& text, int base, long fallback) {
  if (text.empty()) return fallback;
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text.c_str(), &end, base);
  return errno == 0 && end != nullptr && *end == '\0' ? v : fallback;
}

std::vector<int> affinityFromScheduler() {
  // The mask must be at least the kernel's; grow it until the call accepts.
  for (int cpus = 1024; cpus <= (1 << 20); cpus *= 4) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    size_t size = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(size, set);
    if (::sched_getaffinity(0, size, set) == 0) {
      std::vector<int> cores;
      for (int c = 0; c < cpus; ++c)
        if (CPU_ISSET_S(c, size, set)) cores.push_back(c);
      CPU_FREE(set);
      return cores;
    }
    int err = errno;
    CPU_FREE(set);
    if (err != EINVAL) break;
  }
  return {};
}

// The node whose cores include all of `cores`, -1 if none does.
int numaFromSys(const std::vector<int>& cores) {
  if (cores.empty()) return -1;
  for (const std::string& name : listDir(kNodeRoot)) {
    if (!name.starts_with("node")) continue;
    long node = parseNumber(name.substr(4), 10, -1);
    if (node < 0) continue;
    auto list = parseCpuList(readSmall(strCat(kNodeRoot, '/', name, "/cpulist")));
    if (!list.isOk()) continue;
    if (std::includes(list->begin(), list->end(), cores.begin(), cores.end()))
      return static_cast<int>(node);
  }
  return -1;
}

#if BRAID_TOPOLOGY_HWLOC
// Loading costs milliseconds, so the process loads the machine once; only
// the binding, which may change, is asked for at every detection. Read-only
// use of a loaded topology is thread-safe.
class HwlocMachine {
 public:
  static const HwlocMachine& get() {
    static const HwlocMachine machine;
    return machine;
  }
  ~HwlocMachine() {
    if (loaded_) hwloc_topology_destroy(topology_);
  }
  hwloc_topology_t topology() const { return loaded_ ? topology_ : nullptr; }

 private:
  HwlocMachine() {
    if (hwloc_topology_init(&topology_) != 0) return;
    // Caches, cores, packages and I/O would only cost time; PUs and NUMA
    // nodes cannot be filtered and are all that is needed. The x86 backend
    // reads CPUID on every core, which a hypervisor makes slow.
    hwloc_topology_set_all_types_filter(topology_, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_components(topology_, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "x86");
    loaded_ = hwloc_topology_load(topology_) == 0;
    if (!loaded_) hwloc_topology_destroy(topology_);
  }
  hwloc_topology_t topology_ = nullptr;
  bool loaded_ = false;
};

// False when hwloc cannot tell, so that /sys answers instead.
bool affinityFromHwloc(std::vector<int>* cores, int* numaNode) {
  hwloc_topology_t topology = HwlocMachine::get().topology();
  if (topology == nullptr) return false;
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  if (set == nullptr) return false;
  bool ok =
      hwloc_get_cpubind(topology, set, HWLOC_CPUBIND_THREAD) == 0 && !hwloc_bitmap_iszero(set);
  if (ok) {
    cores->clear();
    for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i))
      cores->push_back(i);
    *numaNode = -1;
    for (hwloc_obj_t node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, nullptr);
         node != nullptr; node = hwloc_get_next_obj_by_type(topology, HWLOC_OBJ_NUMANODE, node)) {
      if (node->cpuset != nullptr && hwloc_bitmap_isincluded(set, node->cpuset)) {
        *numaNode = static_cast<int>(node->os_index);
        break;
      }
    }
  }
  hwloc_bitmap_free(set);
  return ok;
}
#endif

// A device's sysfs path lies below its PCI function (a virtio NIC's is one
// level deeper); the nearest listed ancestor owns it.
PciDevice* owner(const std::string& classLink, std::map<std::string, PciDevice*>& byBus) {
  char resolved[PATH_MAX];
  if (::realpath(classLink.c_str(), resolved) == nullptr) return nullptr;
  std::string_view path = resolved;
  while (!path.empty()) {
    size_t slash = path.rfind('/');
    if (slash == std::string_view::npos) break;
    auto it = byBus.find(std::string(path.substr(slash + 1)));
    if (it != byBus.end()) return it->second;
    path = path.substr(0, slash);
  }
  return nullptr;
}

std::vector<PciDevice> pciDevices() {
  std::vector<PciDevice> devices;
  std::vector<bool> virtualFunction;
  for (const std::string& bus : listDir(kPciRoot)) {
    std::string base = strCat(kPciRoot, '/', bus);
    long cls = parseNumber(readSmall(base + "/class"), 16, -1);
    if (cls < 0) continue;
    const auto vendor = static_cast<uint16_t>(parseNumber(readSmall(base + "/vendor"), 16, 0));
    std::optional<DeviceKind> kind = pciDeviceKind(static_cast<uint32_t>(cls), vendor);
    if (!kind) continue;
    PciDevice d;
    d.kind = *kind;
    d.busId = bus;
    d.vendor = vendor;
    d.device = static_cast<uint16_t>(parseNumber(readSmall(base + "/device"), 16, 0));
    d.numaNode =
        static_cast<int>(std::max(-1L, parseNumber(readSmall(base + "/numa_node"), 10, -1)));
    // The kernel driver's own description: no CUDA library loaded for it.
    if (d.kind == DeviceKind::kGpu && vendor == kNvidiaVendor)
      d.uuid = nvidiaGpuUuid(readSmall(strCat(kNvidiaGpuRoot, '/', bus, "/information")));
    devices.push_back(std::move(d));
    virtualFunction.push_back(::access((base + "/physfn").c_str(), F_OK) == 0);
  }
  std::map<std::string, PciDevice*> byBus;
  for (auto& d : devices) byBus[d.busId] = &d;
  for (const std::string& name : listDir("/sys/class/net")) {
    if (PciDevice* d = owner(strCat("/sys/class/net/", name, "/device"), byBus))
      d->netNames.push_back(name);
  }
  // A verbs device with no PCI function is a software one (Soft-RoCE's
  // rxe, siw) over some network interface: kept as a device of its own.
  std::vector<std::string> softwareVerbs;
  for (const std::string& name : listDir("/sys/class/infiniband")) {
    if (PciDevice* d = owner(strCat("/sys/class/infiniband/", name, "/device"), byBus))
      d->ibNames.push_back(name);
    else
      softwareVerbs.push_back(name);
  }
  // Unbound virtual functions belong to virtual machines, not to us, and a
  // NIC may expose dozens of them.
  std::vector<PciDevice> kept;
  for (size_t i = 0; i < devices.size(); ++i) {
    PciDevice& d = devices[i];
    if (virtualFunction[i] && d.kind != DeviceKind::kGpu && d.netNames.empty() && d.ibNames.empty())
      continue;
    kept.push_back(std::move(d));
  }
  for (const std::string& name : softwareVerbs) {
    PciDevice d;
    d.kind = DeviceKind::kInfiniband;
    d.busId = strCat("virtual/", name);  // no PCI address; '/' never is in one
    d.ibNames.push_back(name);
    kept.push_back(std::move(d));
  }
  std::stable_sort(kept.begin(), kept.end(), [](const PciDevice& x, const PciDevice& y) {
    return deviceOrder(x) < deviceOrder(y);
  });
  return kept;
}

}  // namespace

RankTopology detect(const DetectOptions& options) {
  RankTopology r;
  char host[HOST_NAME_MAX + 1] = {};
  if (::gethostname(host, sizeof(host) - 1) == 0) r.hostname = host;
  r.pid = static_cast<int>(::getpid());
  if (!options.hostId.empty()) {
    r.hostId = options.hostId;
  } else {
    std::string boot = readSmall("/proc/sys/kernel/random/boot_id");
    r.hostId = boot.empty() ? r.hostname : strCat(r.hostname, '/', boot);
  }
  bool done = false;
#if BRAID_TOPOLOGY_HWLOC
  if (options.useHwloc) done = affinityFromHwloc(&r.cores, &r.numaNode);
#endif
  if (!done) {
    r.cores = affinityFromScheduler();
    r.numaNode = numaFromSys(r.cores);
  }
  r.devices = pciDevices();
  BRAID_TRACE("topology: ", r.summary());
  return r;
}

}  // namespace braid::topo
