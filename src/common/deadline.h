// A point in time after which a blocking operation gives up; optionally
// also a flag that, once set (an abort from another thread), reaches it at
// once.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>

namespace braid {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  static Deadline after(double seconds) {
    return Deadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds)));
  }
  static Deadline never() { return Deadline(Clock::time_point::max()); }

  // The same deadline, reached also as soon as `*flag` is true. Waits
  // bounded by it (remainingMs) then last at most kFlagCheckMs, so that they
  // see the flag within that.
  Deadline endedBy(const std::atomic<bool>* flag) const {
    Deadline d = *this;
    d.flag_ = flag;
    return d;
  }
  static constexpr int kFlagCheckMs = 50;
  bool ended() const { return flag_ != nullptr && flag_->load(std::memory_order_relaxed); }

  bool expired() const { return ended() || Clock::now() >= at_; }
  // The earlier of this deadline and `seconds` from now, ended by the same flag.
  Deadline within(double seconds) const {
    Deadline d = after(seconds);
    d.at_ = std::min(d.at_, at_);
    d.flag_ = flag_;
    return d;
  }
  // Milliseconds left, clamped to [0, cap] (for poll(2)).
  int remainingMs(int cap) const {
    if (flag_ != nullptr) {
      if (ended()) return 0;
      cap = std::min(cap, kFlagCheckMs);
    }
    if (at_ == Clock::time_point::max()) return cap;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, cap));
  }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
  const std::atomic<bool>* flag_ = nullptr;
};

}  // namespace braid
