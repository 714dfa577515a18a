// The verbs loader and the RDMA probe, against a stand-in libibverbs
// (fake_ibverbs.c, chosen by FAKE_IBVERBS) and against what this machine has.
#include "transports/ib/rdma_probe.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace braid::ib {
namespace {

std::string fakeLibrary() {
  const char* path = std::getenv("FAKE_IBVERBS_PATH");
  return path ? path : "";
}

RdmaProbe probeFake(const char* mode) {
  setenv("FAKE_IBVERBS", mode, 1);
  return probeRdma(fakeLibrary());
}

class RdmaProbeWithVerbs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (fakeLibrary().empty())
      GTEST_SKIP() << "built without libibverbs-dev: the loader is not compiled in";
  }
};

TEST(RdmaProbe, MissingLibraryIsAReasonNotACrash) {
  RdmaProbe probe = probeRdma("libibverbs-not-there.so.9");
  EXPECT_FALSE(probe.available());
  EXPECT_TRUE(probe.devices.empty());
  EXPECT_NE(probe.unavailable.find("libibverbs"), std::string::npos) << probe.unavailable;
  EXPECT_NE(describe(probe).find("unavailable: "), std::string::npos);
}

TEST_F(RdmaProbeWithVerbs, ALibraryWithoutTheEntryPointsIsRefusedByName) {
  RdmaProbe probe = probeRdma("libz.so.1");
  EXPECT_FALSE(probe.available());
  EXPECT_NE(probe.unavailable.find("lacks ibv_get_device_list"), std::string::npos)
      << probe.unavailable;
}

TEST_F(RdmaProbeWithVerbs, AKernelWithoutRdmaSaysSo) {
  RdmaProbe probe = probeFake("enosys");
  EXPECT_FALSE(probe.available());
  EXPECT_NE(probe.unavailable.find("no RDMA in this kernel"), std::string::npos)
      << probe.unavailable;
}

TEST_F(RdmaProbeWithVerbs, NoDevicesIsUnavailable) {
  RdmaProbe probe = probeFake("empty");
  EXPECT_FALSE(probe.available());
  EXPECT_NE(probe.unavailable.find("no RDMA devices"), std::string::npos) << probe.unavailable;
}

TEST_F(RdmaProbeWithVerbs, ADeviceWithoutAnActivePortIsListedButUnavailable) {
  RdmaProbe probe = probeFake("down");
  ASSERT_EQ(probe.devices.size(), 1u);
  ASSERT_EQ(probe.devices[0].ports.size(), 1u);
  EXPECT_EQ(probe.devices[0].ports[0].state, "down");
  EXPECT_FALSE(probe.available());
  EXPECT_NE(probe.unavailable.find("no active port"), std::string::npos) << probe.unavailable;
}

TEST_F(RdmaProbeWithVerbs, AnActiveRocePortMakesRdmaAvailable) {
  RdmaProbe probe = probeFake("roce");
  ASSERT_TRUE(probe.available()) << probe.unavailable;
  ASSERT_EQ(probe.devices.size(), 1u);
  EXPECT_EQ(probe.devices[0].name, "fake0");
  ASSERT_EQ(probe.devices[0].ports.size(), 2u);
  const RdmaPort& roce = probe.devices[0].ports[0];
  EXPECT_EQ(roce.number, 1);
  EXPECT_TRUE(roce.active());
  EXPECT_EQ(roce.linkLayer, "Ethernet");
  EXPECT_EQ(roce.gidCount, 2);
  const RdmaPort& ib = probe.devices[0].ports[1];
  EXPECT_EQ(ib.state, "down");
  EXPECT_EQ(ib.linkLayer, "InfiniBand");
  EXPECT_EQ(ib.lid, 7);
  EXPECT_EQ(describe(probe),
            "fake0 port 1 active Ethernet (gids 2); fake0 port 2 down InfiniBand lid 7 (gids 2)");
}

// Whatever this machine has, the real library is probed without harm and
// an unavailable answer always carries its reason.
TEST(RdmaProbe, ThisMachineAnswersWithDevicesOrAReason) {
  RdmaProbe probe = probeRdma();
  if (probe.available()) {
    EXPECT_FALSE(probe.devices.empty());
  } else {
    EXPECT_FALSE(probe.unavailable.empty());
  }
  std::printf("this machine: %s\n", describe(probe).c_str());
}

}  // namespace
}  // namespace braid::ib
