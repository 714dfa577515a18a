// "GPU work" that tests queue on the stand-in driver's streams
// (fakeCudaLaunchKernel): host functions that the stream's thread runs in
// order with the rest of its work.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

namespace braid::testing {

// Waits while `held` (a test that checks a call returned before this work
// ran releases it after the check, however slow the machine), then 100 ms
// more, then writes value + i to every element, so that work not ordered
// after it reads the old data.
struct SlowFill {
  float* data;
  int count;
  float value;
  std::atomic<bool> done{false};
  std::atomic<bool> held{false};
  static void run(void* self) {
    auto* f = static_cast<SlowFill*>(self);
    while (f->held.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int i = 0; i < f->count; ++i) f->data[i] = f->value + static_cast<float>(i);
    f->done.store(true);
  }
};

// Holds a SlowFill from its construction until release() or the end of its
// scope, so that a test that fails before releasing never leaves it held.
class HeldFill {
 public:
  explicit HeldFill(SlowFill& fill) : fill_(fill) { fill_.held = true; }
  ~HeldFill() { release(); }
  HeldFill(const HeldFill&) = delete;
  HeldFill& operator=(const HeldFill&) = delete;
  void release() { fill_.held = false; }

 private:
  SlowFill& fill_;
};

// Holds its stream until the test opens it.
struct Gate {
  std::atomic<bool> open{false};
  static void run(void* self) {
    auto* g = static_cast<Gate*>(self);
    while (!g->open.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
};

}  // namespace braid::testing
