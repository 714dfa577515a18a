// Which ranks every look has shown waiting, for a while: a Send seen ended
// on one side while its Recv still runs on the other, or a call announced a
// moment before its peers announce theirs, looks like waiting for a look or
// two only.
#pragma once

#include <cstddef>
#include <vector>

namespace braid {

class SteadilyWaiting {
 public:
  // Waiting on every look for at least `seconds`.
  explicit SteadilyWaiting(double seconds) : seconds_(seconds) {}

  // A look at time `now` (seconds, rising): by rank, whether it waits.
  void look(const std::vector<bool>& waiting, double now) {
    if (since_.size() < waiting.size()) since_.resize(waiting.size(), kNotWaiting);
    for (size_t rank = 0; rank < since_.size(); ++rank) {
      if (rank >= waiting.size() || !waiting[rank])
        since_[rank] = kNotWaiting;
      else if (since_[rank] == kNotWaiting)
        since_[rank] = now;
    }
  }
  // Whether every look since `seconds` before `now` showed `rank` waiting.
  bool steadily(int rank, double now) const {
    if (rank < 0 || static_cast<size_t>(rank) >= since_.size()) return false;
    const double since = since_[static_cast<size_t>(rank)];
    return since != kNotWaiting && now - since >= seconds_;
  }

 private:
  static constexpr double kNotWaiting = -1;
  const double seconds_;
  std::vector<double> since_;  // by rank: since when every look showed it waiting
};

}  // namespace braid
