// The verbs adapter over libibverbs (real_verbs.h), against the stand-in
// library (fake_ibverbs.c): what it can show without RDMA hardware, the
// device lookup, the port and error mapping, and that failures come back
// as Status.
#include "transports/ib/real_verbs.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "transports/ib/verbs_library.h"

namespace braid::ib {
namespace {

std::shared_ptr<const VerbsLibrary> fakeLibrary(const char* mode) {
  setenv("FAKE_IBVERBS", mode, 1);
  const char* path = std::getenv("FAKE_IBVERBS_PATH");
  if (!path) return nullptr;
  auto lib = VerbsLibrary::open(path);
  EXPECT_TRUE(lib.isOk()) << lib.status().message();
  if (!lib.isOk()) return nullptr;
  return std::shared_ptr<const VerbsLibrary>(std::move(lib).value());
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(RealVerbs, OpensByNameOrFirstAndMapsThePorts) {
  auto lib = fakeLibrary("roce");
  if (!lib) GTEST_SKIP() << "FAKE_IBVERBS_PATH not set";
  for (const char* name : {"", "fake0"}) {
    auto device = openVerbsDevice(lib, name);
    ASSERT_TRUE(device.isOk()) << device.status().message();
    EXPECT_EQ((*device)->name(), "fake0");
  }
  auto device = openVerbsDevice(lib);
  ASSERT_TRUE(device.isOk());
  auto roce = (*device)->queryPort(1);
  ASSERT_TRUE(roce.isOk()) << roce.status().message();
  EXPECT_TRUE(roce->active());
  EXPECT_EQ(roce->linkLayer, LinkLayer::kEthernet);
  EXPECT_EQ(roce->gidTableLength, 2);
  auto ib = (*device)->queryPort(2);
  ASSERT_TRUE(ib.isOk());
  EXPECT_EQ(ib->state, PortState::kDown);
  EXPECT_EQ(ib->linkLayer, LinkLayer::kInfiniBand);
  EXPECT_EQ(ib->lid, 7);
}

TEST(RealVerbs, AMissingDeviceIsNamedWithTheOnesThere) {
  auto lib = fakeLibrary("roce");
  if (!lib) GTEST_SKIP() << "FAKE_IBVERBS_PATH not set";
  auto device = openVerbsDevice(lib, "mlx5_3");
  ASSERT_FALSE(device.isOk());
  EXPECT_TRUE(contains(device.status().message(), "no RDMA device \"mlx5_3\" (there are fake0)"))
      << device.status().message();
}

TEST(RealVerbs, AKernelWithoutRdmaIsAnError) {
  auto lib = fakeLibrary("enosys");
  if (!lib) GTEST_SKIP() << "FAKE_IBVERBS_PATH not set";
  auto device = openVerbsDevice(lib);
  ASSERT_FALSE(device.isOk());
  EXPECT_TRUE(contains(device.status().message(), "ibv_get_device_list"))
      << device.status().message();
  auto none = openVerbsDevice(fakeLibrary("empty"));
  ASSERT_FALSE(none.isOk());
  EXPECT_EQ(none.status().code(), ErrorCode::kNotSupported);
}

// The stand-in fails every resource call: each failure is a Status, and the
// device (whose context the stand-in owns) closes cleanly after.
TEST(RealVerbs, FailedVerbsComeBackAsStatus) {
  auto lib = fakeLibrary("roce");
  if (!lib) GTEST_SKIP() << "FAKE_IBVERBS_PATH not set";
  auto device = openVerbsDevice(lib);
  ASSERT_TRUE(device.isOk());
  auto gid = (*device)->queryGid(1, 0);
  ASSERT_FALSE(gid.isOk());
  EXPECT_TRUE(contains(gid.status().message(), "ibv_query_gid")) << gid.status().message();
  auto pd = (*device)->allocProtectionDomain();
  ASSERT_FALSE(pd.isOk());
  EXPECT_TRUE(contains(pd.status().message(), "ibv_alloc_pd")) << pd.status().message();
  auto cq = (*device)->createCompletionQueue(16);
  ASSERT_FALSE(cq.isOk());
  EXPECT_TRUE(contains(cq.status().message(), "ibv_create_cq")) << cq.status().message();
}

}  // namespace
}  // namespace braid::ib
