// Waiting for GPU work that may never finish (a stream that waits for a
// peer's process, copies behind a held stream): polled, never blocked in the
// driver, and given up after a limit.
#pragma once

#include <chrono>
#include <thread>

#include "src/common/status.h"

namespace braid {

// Calls `done` (returning Result<bool>; an error ends the wait with it) until
// it says true, or until `limitSeconds` have passed: true if done, false if
// the limit came first (`done` is asked at least once). As a driver's own
// wait: yielding between looks for the first 2 ms, then 100 us sleeps.
template <typename Done>
Result<bool> pollUntil(Done done, double limitSeconds) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto limit = std::chrono::duration<double>(limitSeconds);
  while (true) {
    Result<bool> finished = done();
    if (!finished.isOk() || *finished) return finished;
    const auto waited = Clock::now() - start;
    if (waited >= limit) return false;
    if (waited < std::chrono::milliseconds(2))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace braid
