// When braid tells the user that ranks share a GPU without MPS: only when
// more ranks share a host than it has NVIDIA GPUs and MPS is not known to
// be on.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "src/gpu_path.h"

namespace braid {
namespace {

TEST(SharedGpuWarning, OnlyWhereRanksOutnumberGpusWithoutMps) {
  // As many ranks as GPUs, or fewer: each may have its own.
  EXPECT_EQ(sharedGpuWarning(0, 8, 8, false), "");
  EXPECT_EQ(sharedGpuWarning(0, 1, 1, std::nullopt), "");
  // No NVIDIA GPU listed (a container without /sys, another maker's GPU):
  // nothing known to share.
  EXPECT_EQ(sharedGpuWarning(0, 4, 0, false), "");
  // MPS on: the processes run at once.
  EXPECT_EQ(sharedGpuWarning(0, 2, 1, true), "");

  const std::string off = sharedGpuWarning(1, 2, 1, false);
  EXPECT_NE(off.find("rank 1: 2 ranks of this host share its 1 NVIDIA GPU, and MPS is off"),
            std::string::npos)
      << off;
  EXPECT_NE(off.find("nvidia-cuda-mps-control -d"), std::string::npos) << off;
  const std::string unknown = sharedGpuWarning(0, 16, 8, std::nullopt);
  EXPECT_NE(unknown.find("16 ranks of this host share its 8 NVIDIA GPUs, and the driver does not "
                         "say whether MPS is on"),
            std::string::npos)
      << unknown;
}

}  // namespace
}  // namespace braid
