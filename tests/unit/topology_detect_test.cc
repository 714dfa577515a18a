// Topology detection: what detect() finds on this machine and how it classes what it finds.
// Cores and NUMA node from sysfs or hwloc, PCI devices and their kinds, the host id.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "src/common/env.h"
#include "tests/unit/topology_fixtures.h"
#include "topology/topology.h"

namespace braid::topo {
namespace {

namespace fs = std::filesystem;

std::string hostname() {
  char host[HOST_NAME_MAX + 1] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// Pinned ranks (one core each) do not outnumber their host's cores; ranks
// that all may run on the same two do.
TEST(HostShares, CountCoresAsTheUnionOverTheRanksOfAHost) {
  auto rank = [](std::string host, std::vector<int> cores) {
    RankTopology r;
    r.hostId = std::move(host);
    r.cores = std::move(cores);
    return r;
  };
  std::vector<RankTopology> ranks = {rank("a", {0}),   rank("a", {1}),    rank("a", {2}),
                                     rank("a", {3}),   rank("b", {0, 1}), rank("b", {0, 1}),
                                     rank("b", {0, 1})};
  std::vector<HostShare> shares = hostShares(ranks);
  ASSERT_EQ(shares.size(), ranks.size());
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(shares[r].ranks, 4) << r;
    EXPECT_EQ(shares[r].cores, 4) << r;
  }
  for (int r = 4; r < 7; ++r) {
    EXPECT_EQ(shares[r].ranks, 3) << r;
    EXPECT_EQ(shares[r].cores, 2) << r;
  }
}

// The NVIDIA GPUs of a host, as its ranks list them (each lists all of the
// host's): another maker's GPU and a NIC do not count.
TEST(HostShares, CountTheNvidiaGpusOfAHost) {
  auto rank = [](std::string host, int nvidiaGpus) {
    RankTopology r;
    r.hostId = std::move(host);
    for (int g = 0; g < nvidiaGpus; ++g)
      r.devices.push_back(
          {DeviceKind::kGpu, "0000:0" + std::to_string(g) + ":00.0", kNvidiaVendor});
    r.devices.push_back({DeviceKind::kGpu, "0000:80:00.0", 0x1002});
    r.devices.push_back({DeviceKind::kEthernet, "0000:81:00.0", 0x8086});
    return r;
  };
  std::vector<RankTopology> ranks = {rank("a", 1), rank("a", 1), rank("b", 8), rank("c", 0)};
  std::vector<HostShare> shares = hostShares(ranks);
  ASSERT_EQ(shares.size(), ranks.size());
  EXPECT_EQ(shares[0].nvidiaGpus, 1);
  EXPECT_EQ(shares[1].nvidiaGpus, 1);
  EXPECT_EQ(shares[2].nvidiaGpus, 8);
  EXPECT_EQ(shares[3].nvidiaGpus, 0);
}

// A display controller is a GPU only when a GPU maker made it: servers
// carry a BMC's VGA (ASPEED, Matrox) and virtual machines an emulated one.
TEST(PciDeviceKind, GpusAreDisplayControllersOfGpuMakers) {
  constexpr uint32_t kVga = 0x030000, k3d = 0x030200, kDisplayOther = 0x038000;
  EXPECT_EQ(pciDeviceKind(k3d, 0x10de), DeviceKind::kGpu);            // NVIDIA H100
  EXPECT_EQ(pciDeviceKind(kVga, 0x10de), DeviceKind::kGpu);           // NVIDIA workstation
  EXPECT_EQ(pciDeviceKind(kDisplayOther, 0x1002), DeviceKind::kGpu);  // AMD Instinct
  EXPECT_EQ(pciDeviceKind(kVga, 0x8086), DeviceKind::kGpu);           // Intel
  EXPECT_EQ(pciDeviceKind(kVga, 0x1a03), std::nullopt);               // ASPEED BMC
  EXPECT_EQ(pciDeviceKind(kVga, 0x1234), std::nullopt);               // QEMU's VGA
  EXPECT_EQ(pciDeviceKind(kVga, 0x102b), std::nullopt);               // Matrox BMC
  EXPECT_EQ(pciDeviceKind(0x020000, 0x15b3), DeviceKind::kEthernet);
  EXPECT_EQ(pciDeviceKind(0x020700, 0x15b3), DeviceKind::kInfiniband);
  EXPECT_EQ(pciDeviceKind(0x010802, 0x10de), std::nullopt);  // an NVMe drive
}

TEST(Detect, DescribesThisProcess) {
  RankTopology r = detect();
  EXPECT_EQ(r.hostname, hostname());
  EXPECT_EQ(r.pid, getpid());
  EXPECT_FALSE(r.hostId.empty());
  EXPECT_EQ(r.hostId.rfind(r.hostname, 0), 0u) << r.hostId;
  ASSERT_FALSE(r.cores.empty());
  EXPECT_TRUE(std::is_sorted(r.cores.begin(), r.cores.end()));
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(static_cast<int>(r.cores.size()), CPU_COUNT(&set));
  for (int c : r.cores) EXPECT_TRUE(CPU_ISSET(c, &set)) << "core " << c;
  // -1: the cores span NUMA nodes or the machine has no NUMA information.
  EXPECT_GE(r.numaNode, -1);
  if (r.numaNode >= 0) {
    EXPECT_TRUE(fs::exists("/sys/devices/system/node/node" + std::to_string(r.numaNode)));
  }
  std::cout << r.summary() << "\n";
}

TEST(Detect, HwlocAndSysAgree) {
  RankTopology viaHwloc = detect({.useHwloc = true});
  RankTopology viaSys = detect({.useHwloc = false});
  EXPECT_EQ(viaHwloc.cores, viaSys.cores);
  EXPECT_EQ(viaHwloc.numaNode, viaSys.numaNode);
}

TEST(Detect, FollowsTheAffinityMask) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
    if (CPU_ISSET(c, &saved)) first = c;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  RankTopology viaHwloc = detect({.useHwloc = true});
  RankTopology viaSys = detect({.useHwloc = false});
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(viaHwloc.cores, std::vector<int>{first});
  EXPECT_EQ(viaSys.cores, std::vector<int>{first});
  // A single core always lies in one node when the machine has NUMA data.
  if (fs::exists("/sys/devices/system/node/node0")) {
    EXPECT_GE(viaSys.numaNode, 0);
  }
  EXPECT_EQ(viaHwloc.numaNode, viaSys.numaNode);
}

TEST(Detect, DevicesExistInSysfs) {
  RankTopology r = detect();
  for (const auto& d : r.devices) {
    EXPECT_TRUE(fs::exists("/sys/bus/pci/devices/" + d.busId)) << d.busId;
    EXPECT_GE(d.numaNode, -1);
    for (const auto& n : d.netNames) EXPECT_TRUE(fs::exists("/sys/class/net/" + n)) << n;
    for (const auto& n : d.ibNames) EXPECT_TRUE(fs::exists("/sys/class/infiniband/" + n)) << n;
  }
  EXPECT_TRUE(std::is_sorted(
      r.devices.begin(), r.devices.end(),
      [](const PciDevice& x, const PciDevice& y) { return deviceOrder(x) < deviceOrder(y); }));
  // Every interface backed by a PCI network function is attributed to it.
  for (const auto& entry : fs::directory_iterator("/sys/class/net")) {
    std::error_code ec;
    fs::path device = fs::canonical(entry.path() / "device", ec);
    if (ec) continue;
    std::string cls;
    for (fs::path p = device; p.has_parent_path() && p != p.parent_path(); p = p.parent_path()) {
      if (std::ifstream(p / "class") >> cls; !cls.empty()) break;
    }
    if (!cls.starts_with("0x0200") && !cls.starts_with("0x0207")) continue;
    std::string name = entry.path().filename();
    bool found = false;
    for (const auto& d : r.devices)
      found = found || std::count(d.netNames.begin(), d.netNames.end(), name) > 0;
    EXPECT_TRUE(found) << name;
  }
}

TEST(Detect, IsCheap) {
  detect();
  auto start = std::chrono::steady_clock::now();
  constexpr int kRuns = 10;
  for (int i = 0; i < kRuns; ++i) detect();
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
      kRuns;
  std::cout << "detect(): " << ms << " ms\n";
  // Generous: the machine running the tests may be busy.
  EXPECT_LT(ms, 50);
}

TEST(Detect, HostIdOverride) {
  EXPECT_EQ(detect({.hostId = "rack7-node3"}).hostId, "rack7-node3");
  ScopedEnv e("BRAID_HOSTID", "shared box");
  auto config = loadConfig();
  ASSERT_TRUE(config.isOk()) << config.status().message();
  EXPECT_EQ(config->hostId, "shared box");
  auto local = localTopology(config.value(), 0, 1);
  ASSERT_TRUE(local.isOk()) << local.status().message();
  EXPECT_EQ(local->hostId, "shared box");
  // Equal ids are one host whatever the hostnames say; different ids are not.
  std::vector<RankTopology> ranks = {local.value(), rankOn("elsewhere", -1)};
  ranks[1].hostId = "shared box";
  EXPECT_EQ(classify(ranks, 0, 1), LinkKind::kSameHost);
  ranks[1].hostId = "other box";
  EXPECT_EQ(classify(ranks, 0, 1), LinkKind::kNetwork);
}

TEST(Detect, OverlongHostIdIsAConfigError) {
  std::string big(300, 'x');
  ScopedEnv e("BRAID_HOSTID", big.c_str());
  auto config = loadConfig();
  ASSERT_FALSE(config.isOk());
  EXPECT_NE(config.status().message().find("BRAID_HOSTID"), std::string::npos);
}

}  // namespace
}  // namespace braid::topo
