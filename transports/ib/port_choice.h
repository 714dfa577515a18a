// Which device, port and GID an RDMA connection uses: BRAID_IB_HCA's
// filter over the devices found, active ports only, and on RoCE the GID
// index (BRAID_IB_GID_INDEX, else one chosen from the table).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "src/common/status.h"
#include "transports/ib/rdma_probe.h"
#include "transports/ib/verbs.h"

namespace braid::ib {

// BRAID_IB_HCA: "mlx5_0:1,mlx5_1" keeps those devices (a name is a prefix
// unless it starts with '='; ":N" picks one port), "^mlx5_2" keeps all but
// those; "" keeps all.
struct HcaFilter {
  bool exclude = false;
  struct Entry {
    std::string name;
    bool exact = false;
    int port = 0;  // 0: any
  };
  std::vector<Entry> entries;
  bool allows(const std::string& device, int port) const;
};
Result<HcaFilter> parseHcaFilter(const std::string& text);

struct PortChoice {
  std::string device;
  int port = 0;
};

// An active port the filter allows: on the first device of `nearFirst`
// that has one (the devices closest to the rank's NUMA node), else the
// first in the probe's order; or, naming every device and port seen, why
// there is none.
Result<PortChoice> choosePort(const RdmaProbe& probe, const HcaFilter& filter,
                              const std::vector<std::string>& nearFirst = {});

// The GID index RoCE traffic leaves from: `forced` when >= 0 (it must name
// a non-zero entry), else the first IPv4-mapped GID (RoCE v2 over IPv4
// routes between subnets), else the first non-zero one. InfiniBand: 0.
Result<int> chooseGidIndex(Device& device, uint8_t port, int forced);

}  // namespace braid::ib
