// When a host stream's worker and the threads that wait for it poll before
// they sleep (src/stream.h): only where every rank of the host can have two
// cores, one for the caller and one for the worker, and never longer than
// BRAID_SPIN_US or 50 us.
#include <gtest/gtest.h>

#include "src/stream.h"

namespace braid {
namespace {

TEST(StreamSpin, PollsOnlyWithTwoCoresForEachRank) {
  EXPECT_DOUBLE_EQ(streamSpinSeconds(1, 2, 500e-6), 50e-6);
  EXPECT_DOUBLE_EQ(streamSpinSeconds(4, 8, 500e-6), 50e-6);
  EXPECT_DOUBLE_EQ(streamSpinSeconds(4, 64, 500e-6), 50e-6);
  // A caller and a worker per rank would be more threads than cores.
  EXPECT_EQ(streamSpinSeconds(1, 1, 500e-6), 0);
  EXPECT_EQ(streamSpinSeconds(2, 2, 500e-6), 0);
  EXPECT_EQ(streamSpinSeconds(5, 9, 500e-6), 0);
  EXPECT_EQ(streamSpinSeconds(0, 8, 500e-6), 0);
}

TEST(StreamSpin, NeverLongerThanBraidSpinUs) {
  EXPECT_DOUBLE_EQ(streamSpinSeconds(1, 4, 20e-6), 20e-6);
  EXPECT_EQ(streamSpinSeconds(1, 4, 0), 0);  // BRAID_SPIN_US=0: sleep at once
}

}  // namespace
}  // namespace braid
