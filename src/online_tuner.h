// Measuring instead of predicting. On a host where a round's cost is set by
// the scheduler (ranks outnumbering cores, a VM's wake-ups), no alpha-beta-
// gamma model ranks the algorithms reliably; timing them does. For every
// (stream, collective, size class) the first call runs the model's choice
// (and warms caches and pages up), the next ones try each algorithm in turn,
// and once every one has run kTrials times the ranks agree on the fastest
// (an AllReduce of their times, the slowest rank's counting) and keep it.
//
// Every rank makes the same calls on a stream in the same order, so every
// rank walks the same states and the choice needs no other coordination.
#pragma once

#include <map>
#include <span>
#include <tuple>
#include <vector>

#include "algorithms/algorithm.h"

namespace braid {

class OnlineTuner {
 public:
  static constexpr int kTrials = 2;

  struct Key {
    int stream;
    algo::CollectiveKind kind;
    int sizeClass;  // floor(log2(bytes per rank)), -1 for 0 bytes
    auto operator<=>(const Key&) const = default;
  };
  static Key keyFor(int stream, const algo::CollectiveArgs& args);

  struct Choice {
    const algo::Algorithm* algorithm = nullptr;
    int trial = -1;  // index of the candidate being timed; -1: not timed
  };
  // The algorithm for the next call of `key`. `candidates` (the collective's
  // algorithms) and `modelChoice` are used the first time a key is seen.
  Choice next(const Key& key, std::span<const algo::Algorithm* const> candidates,
              const algo::Algorithm* modelChoice);
  // Records a trial. True when the trials of `key` are complete: the caller
  // then combines times() over the ranks (maximum) and calls decide().
  bool record(const Key& key, int trial, double seconds);
  std::vector<double> times(const Key& key) const;
  // Keeps the candidate with the lowest agreed time; returns it.
  const algo::Algorithm* decide(const Key& key, std::span<const double> agreed);

 private:
  struct State {
    std::vector<const algo::Algorithm*> candidates;
    const algo::Algorithm* modelChoice = nullptr;
    std::vector<double> best;  // per candidate, the fastest of its trials
    int calls = 0;             // calls of this key so far
    const algo::Algorithm* decided = nullptr;
  };
  std::map<Key, State> states_;
};

}  // namespace braid
