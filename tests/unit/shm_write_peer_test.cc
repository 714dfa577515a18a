// ShmStream::writePeer and close(): a rank whose receive failed gets its
// buffer back only once its peer can no longer write into it. The peer
// announces each write in shared memory before it checks whether this end
// closed, and close() waits for a write so announced to end: a write either
// sees the close and does nothing, or is over before close() returns.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "tests/unit/stream_connection_fixtures.h"

namespace braid::transport {
namespace {

using Clock = std::chrono::steady_clock;

class WritePeer : public SingleCopy {};

// What the peer writes after this end closed is refused, not written.
TEST_F(WritePeer, AWriteIntoAStreamThatClosedIsRefused) {
  Pair p("shm_cma", patient());
  std::vector<uint8_t> target(4096, 0), source(4096, 0xAB);
  const auto address = reinterpret_cast<uintptr_t>(target.data());
  ASSERT_TRUE(p.as->writePeer(address, 0, source.data(), 64).isOk());
  ASSERT_EQ(target[0], 0xAB);
  p.bs->close();
  EXPECT_FALSE(p.as->writePeer(address + 64, 0, source.data() + 64, 4032).isOk());
  EXPECT_TRUE(std::all_of(target.begin() + 64, target.end(), [](uint8_t b) { return b == 0; }));
}

// A write under way when this end closes is over before close() returns:
// nothing in the buffer changes after it.
TEST_F(WritePeer, CloseReturnsOnlyOnceAWriteUnderWayIsOver) {
  Pair p("shm_cma", patient());
  const size_t bytes = size_t{128} << 20;
  std::vector<uint8_t> target(bytes, 0), source(bytes, 0x5A);
  std::atomic<bool> written{false};
  std::thread writer([&] {
    written =
        p.as->writePeer(reinterpret_cast<uintptr_t>(target.data()), 0, source.data(), bytes).isOk();
  });
  // Closed as soon as the first bytes landed, long before the last.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (reinterpret_cast<volatile uint8_t&>(target[0]) == 0 && Clock::now() < deadline) {
  }
  p.bs->close();
  const uint8_t lastAtClose = reinterpret_cast<volatile uint8_t&>(target[bytes - 1]);
  writer.join();
  ASSERT_TRUE(written) << "the write began before the close, so it was not refused";
  EXPECT_EQ(lastAtClose, target[bytes - 1]) << "the buffer changed after close() returned";
}

}  // namespace
}  // namespace braid::transport
