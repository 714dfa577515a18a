// What this process can see of RDMA: the verbs devices and their ports, or
// why there are none. libibverbs is loaded at run time (verbs_library.h),
// so libbraid starts where rdma-core is absent and this only says so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace braid::ib {

struct RdmaPort {
  int number = 0;         // 1-based, as verbs counts them
  std::string state;      // "active", "down", ...
  std::string linkLayer;  // "InfiniBand" or "Ethernet" (RoCE)
  uint16_t lid = 0;       // InfiniBand only
  int gidCount = 0;       // entries in the GID table
  bool active() const { return state == "active"; }
};

struct RdmaDevice {
  std::string name;  // "mlx5_0", "rxe0"
  std::vector<RdmaPort> ports;
};

struct RdmaProbe {
  std::vector<RdmaDevice> devices;
  // Why there is no usable device: empty when one has an active port.
  std::string unavailable;
  bool available() const { return unavailable.empty(); }
};

// The soname braid loads; tests point it at a model of the library.
inline constexpr const char* kVerbsLibrary = "libibverbs.so.1";

// Opens `library`, lists its devices and queries their ports. Never fails:
// a missing library, a kernel without RDMA (ibv_get_device_list sets
// ENOSYS), no devices or no active port are all reasons in `unavailable`.
RdmaProbe probeRdma(const std::string& library = kVerbsLibrary);

// "rxe0 port 1 active Ethernet (gids 2); ..." or "unavailable: <reason>".
std::string describe(const RdmaProbe& probe);

}  // namespace braid::ib
