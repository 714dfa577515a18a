// A point in time after which a blocking operation gives up.
#pragma once

#include <algorithm>
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

  bool expired() const { return Clock::now() >= at_; }
  // The earlier of this deadline and `seconds` from now.
  Deadline within(double seconds) const { return std::min(*this, after(seconds)); }
  bool operator<(const Deadline& other) const { return at_ < other.at_; }
  // Milliseconds left, clamped to [0, cap] (for poll(2)).
  int remainingMs(int cap) const {
    if (at_ == Clock::time_point::max()) return cap;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left, 0, cap));
  }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

}  // namespace braid
