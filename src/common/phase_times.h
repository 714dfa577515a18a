// Where a long operation's time went, phase by phase, for the log. Slow
// start-up is a common complaint about collective libraries, and a total
// alone does not say whether the rendezvous, the connections or the
// measurements took it.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace braid {

class PhaseTimes {
 public:
  PhaseTimes() : start_(Clock::now()), last_(start_) {}

  // Ends the phase running since the previous call (or construction) and
  // names it.
  void end(const char* phase) {
    const Clock::time_point now = Clock::now();
    phases_.push_back({phase, seconds(now - last_)});
    last_ = now;
  }

  // "0.431 s: rendezvous 0.021, shared memory 0.240, ...", in seconds.
  std::string describe() const {
    std::string text = format(seconds(last_ - start_)) + " s:";
    for (size_t i = 0; i < phases_.size(); ++i)
      text += std::string(i == 0 ? " " : ", ") + phases_[i].name + " " + format(phases_[i].seconds);
    return text;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Phase {
    const char* name;
    double seconds;
  };
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  static std::string format(double seconds) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3f", seconds);
    return text;
  }

  Clock::time_point start_, last_;
  std::vector<Phase> phases_;
};

}  // namespace braid
