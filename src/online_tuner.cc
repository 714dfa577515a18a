#include "src/online_tuner.h"

#include <bit>
#include <limits>

#include "src/common/median.h"

namespace braid {

OnlineTuner::Key OnlineTuner::keyFor(int stream, const algo::CollectiveArgs& args) {
  const size_t bytes = args.bytes();
  return {stream, args.kind, bytes == 0 ? -1 : static_cast<int>(std::bit_width(bytes)) - 1};
}

OnlineTuner::Choice OnlineTuner::next(const Key& key,
                                      std::span<const algo::Algorithm* const> candidates,
                                      const algo::Algorithm* modelChoice) {
  auto [it, fresh] = states_.try_emplace(key);
  State& s = it->second;
  if (fresh) {
    s.candidates.assign(candidates.begin(), candidates.end());
    s.modelChoice = modelChoice;
    s.timed.assign(s.candidates.size(), {});
  }
  const int call = s.calls++;
  if (s.decided) return {s.decided, -1};
  if (s.candidates.size() < 2) {
    s.decided = s.candidates.empty() ? modelChoice : s.candidates[0];
    return {s.decided, -1};
  }
  if (call == 0) return {s.modelChoice, -1};  // warm-up, untimed
  const int block = (call - 1) / kBlockCalls;
  const int candidate = block % static_cast<int>(s.candidates.size());
  const bool settles = (call - 1) % kBlockCalls == 0;
  return {s.candidates[candidate], settles ? -1 : candidate};
}

bool OnlineTuner::record(const Key& key, int trial, double seconds) {
  State& s = states_.at(key);
  s.timed[trial].push_back(seconds);
  return s.calls - 1 == trialCalls(s.candidates.size());
}

std::vector<double> OnlineTuner::times(const Key& key) const {
  std::vector<double> medians;
  for (const std::vector<double>& t : states_.at(key).timed)
    medians.push_back(t.empty() ? std::numeric_limits<double>::infinity() : median(t));
  return medians;
}

const algo::Algorithm* OnlineTuner::decide(const Key& key, std::span<const double> agreed) {
  State& s = states_.at(key);
  size_t fastest = 0;
  for (size_t i = 1; i < agreed.size() && i < s.candidates.size(); ++i)
    if (agreed[i] < agreed[fastest]) fastest = i;
  s.decided = s.candidates[fastest];
  for (size_t i = 0; i < agreed.size() && i < s.candidates.size(); ++i)
    if (s.candidates[i] == s.modelChoice && agreed[i] <= agreed[fastest] * (1 + kMargin))
      s.decided = s.modelChoice;
  return s.decided;
}

}  // namespace braid
