// The latency-bandwidth-reduction (alpha, beta, gamma) cost model that
// ranks the algorithms of a collective: sending m bytes costs alpha + m*beta,
// reducing m bytes costs m*gamma. One LinkModel per class of link.
#pragma once

#include <cstddef>

namespace braid::algo {

struct LinkModel {
  double alpha = 20e-6;       // seconds per message: latency plus software overhead
  double beta = 1.0 / 1.5e9;  // seconds per byte sent
  double gamma = 1.0 / 6e9;   // seconds per byte reduced (also: per byte of a local copy pass)
};

// What an algorithm costs the slowest rank: the predicted time, the number
// of sequential communication rounds on its critical path, and the bytes
// it sends in all.
struct Cost {
  double seconds = 0;
  int steps = 0;
  double bytesSent = 0;
};

// Time of `rounds` sequential rounds moving `bytes` each, all of it on the
// critical path.
inline double roundsTime(const LinkModel& m, double rounds, double bytesPerRound) {
  return rounds * (m.alpha + bytesPerRound * m.beta);
}

}  // namespace braid::algo
