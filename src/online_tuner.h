// Measuring instead of predicting. On a host where a round's cost is set by
// the scheduler (ranks outnumbering cores, a VM's wake-ups), no alpha-beta-
// gamma model ranks the algorithms reliably; timing them does. For every
// (stream, collective, size class) the first call runs the model's choice
// (and warms caches and pages up), the next ones try each candidate in turn
// (the model's shortlist: those it predicts within a factor of its choice),
// in blocks of kBlockCalls calls, kRounds blocks each. A block's first call
// is not timed: it absorbs the skew the previous algorithm left between the
// ranks (a fold's rank leaves later than the others, say), which otherwise
// lands on the next call and is charged to the wrong candidate. A
// candidate's figure is the median of its timed calls, so a call stretched
// by a preemption does not count. Once every block has run the ranks agree
// on the figures (an AllReduce, the slowest rank's counting). The model's
// choice stays unless another candidate was faster by more than kMargin: a
// timing that close is within the noise of a few calls, and the model's
// reasons hold for every call, not only the timed ones.
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
  static constexpr int kRounds = 3;
  static constexpr int kBlockCalls = 3;
  static constexpr double kMargin = 0.05;
  // Calls a key spends trying `candidates` algorithms (2 or more), after
  // its warm-up call.
  static constexpr int trialCalls(size_t candidates) {
    return kRounds * kBlockCalls * static_cast<int>(candidates);
  }

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
  // The algorithm for the next call of `key`. `candidates` (the model's
  // shortlist) and `modelChoice` are read only the first time a key is seen.
  Choice next(const Key& key, std::span<const algo::Algorithm* const> candidates,
              const algo::Algorithm* modelChoice);
  // Whether `key` has been seen (its candidates are fixed from then on).
  bool knows(const Key& key) const { return states_.count(key) > 0; }
  std::vector<const algo::Algorithm*> candidates(const Key& key) const {
    return states_.at(key).candidates;
  }
  // Records a trial. True when the trials of `key` are complete: the caller
  // then combines times() over the ranks (maximum) and calls decide().
  bool record(const Key& key, int trial, double seconds);
  // Per candidate, the median of its timed calls.
  std::vector<double> times(const Key& key) const;
  // Keeps the model's choice, unless a candidate's agreed time is lower by
  // more than kMargin: then the fastest. Returns it.
  const algo::Algorithm* decide(const Key& key, std::span<const double> agreed);

 private:
  struct State {
    std::vector<const algo::Algorithm*> candidates;
    const algo::Algorithm* modelChoice = nullptr;
    std::vector<std::vector<double>> timed;  // per candidate, its timed calls
    int calls = 0;                           // calls of this key so far
    const algo::Algorithm* decided = nullptr;
  };
  std::map<Key, State> states_;
};

}  // namespace braid
