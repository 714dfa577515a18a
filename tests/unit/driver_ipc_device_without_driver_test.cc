// DriverIpcDevice in a process that has no CUDA driver loaded: meson runs
// this without FAKE_LIBCUDA, so nothing loads the stand-in either.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "transports/cuda_ipc/driver_ipc_device.h"

namespace braid::transport::cuda_ipc {
namespace {

bool driverLoaded() {
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle) dlclose(handle);
  return handle != nullptr;
}

TEST(DriverIpcDeviceWithoutDriver, CreateIsNotSupported) {
  ASSERT_FALSE(driverLoaded());
  auto device = DriverIpcDevice::create(0);
  ASSERT_FALSE(device.isOk());
  EXPECT_EQ(device.status().code(), ErrorCode::kNotSupported);
  EXPECT_NE(device.status().message().find("the CUDA driver (libcuda.so.1) is not loaded"),
            std::string::npos)
      << device.status().message();
}

}  // namespace
}  // namespace braid::transport::cuda_ipc
