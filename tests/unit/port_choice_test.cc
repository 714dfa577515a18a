// Device, port and GID choice for RDMA connections (transports/ib/port_choice.h):
// BRAID_IB_HCA's filter, active ports only, and the RoCE GID index.
#include "transports/ib/port_choice.h"

#include <gtest/gtest.h>

#include "transports/ib/model_verbs.h"

namespace braid::ib {
namespace {

RdmaProbe twoDevices() {
  RdmaProbe probe;
  probe.devices = {{"mlx5_0", {{1, "down", "InfiniBand"}, {2, "active", "InfiniBand"}}},
                   {"mlx5_1", {{1, "active", "Ethernet"}}},
                   {"rxe0", {{1, "active", "Ethernet"}}}};
  return probe;
}

PortChoice chosen(const std::string& hca) {
  auto filter = parseHcaFilter(hca);
  EXPECT_TRUE(filter.isOk()) << filter.status().message();
  auto choice = choosePort(twoDevices(), *filter);
  EXPECT_TRUE(choice.isOk()) << choice.status().message();
  return choice.isOk() ? *choice : PortChoice{};
}

TEST(PortChoice, TheFirstActivePortTheFilterAllows) {
  EXPECT_EQ(chosen("").device, "mlx5_0");
  EXPECT_EQ(chosen("").port, 2);  // port 1 is down
  EXPECT_EQ(chosen("mlx5_1").device, "mlx5_1");
  EXPECT_EQ(chosen("mlx5").device, "mlx5_0");  // a prefix
  EXPECT_EQ(chosen("^mlx5").device, "rxe0");
  EXPECT_EQ(chosen("^mlx5_0:2").device, "mlx5_1");
  EXPECT_EQ(chosen("=rxe0,mlx5_1:1").device, "mlx5_1");  // device order, not the list's
}

TEST(PortChoice, TheDeviceNearestTheRankComesFirst) {
  auto filter = parseHcaFilter("");
  ASSERT_TRUE(filter.isOk());
  auto near = choosePort(twoDevices(), *filter, {"rxe0"});
  ASSERT_TRUE(near.isOk());
  EXPECT_EQ(near->device, "rxe0");
  // A near device with no active port, or one the filter leaves out, is passed over.
  auto down = choosePort(twoDevices(), *parseHcaFilter("^rxe0"), {"rxe0", "mlx5_1"});
  ASSERT_TRUE(down.isOk());
  EXPECT_EQ(down->device, "mlx5_1");
  auto unknown = choosePort(twoDevices(), *filter, {"mlx9"});
  ASSERT_TRUE(unknown.isOk());
  EXPECT_EQ(unknown->device, "mlx5_0");
}

TEST(PortChoice, NothingAllowedSaysWhatWasSeen) {
  auto filter = parseHcaFilter("mlx5_0:1");
  ASSERT_TRUE(filter.isOk());
  auto choice = choosePort(twoDevices(), *filter);
  ASSERT_FALSE(choice.isOk());
  const std::string& m = choice.status().message();
  EXPECT_NE(m.find("mlx5_0:1 down"), std::string::npos) << m;
  EXPECT_NE(m.find("rxe0:1 active (excluded by BRAID_IB_HCA)"), std::string::npos) << m;

  RdmaProbe none;
  none.unavailable = "the kernel has no RDMA support (ENOSYS)";
  auto nothing = choosePort(none, HcaFilter{});
  ASSERT_FALSE(nothing.isOk());
  EXPECT_NE(nothing.status().message().find("ENOSYS"), std::string::npos);
}

TEST(PortChoice, MalformedFiltersAreRefused) {
  for (const char* bad : {"mlx5_0:", "mlx5_0:x", "mlx5_0:0", ":1", "a,,b", "^"})
    EXPECT_FALSE(parseHcaFilter(bad).isOk()) << bad;
}

TEST(GidChoice, RoceTakesTheIpv4MappedGidUnlessForced) {
  auto device = openModelDevice("model0");
  ASSERT_TRUE(device.isOk());
  auto automatic = chooseGidIndex(**device, 1, -1);
  ASSERT_TRUE(automatic.isOk()) << automatic.status().message();
  EXPECT_EQ(*automatic, 1);  // 0 is link-local, 1 IPv4-mapped
  auto forced = chooseGidIndex(**device, 1, 0);
  ASSERT_TRUE(forced.isOk());
  EXPECT_EQ(*forced, 0);
  auto outside = chooseGidIndex(**device, 1, 9);
  ASSERT_FALSE(outside.isOk());
  EXPECT_NE(outside.status().message().find("BRAID_IB_GID_INDEX=9"), std::string::npos);
  auto infiniband = chooseGidIndex(**device, 2, -1);
  ASSERT_TRUE(infiniband.isOk());
  EXPECT_EQ(*infiniband, 0);
}

}  // namespace
}  // namespace braid::ib
