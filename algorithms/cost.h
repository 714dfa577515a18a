// The latency-bandwidth-reduction (alpha, beta, gamma) cost model that
// ranks the algorithms of a collective: sending m bytes costs alpha + m*beta,
// reducing m bytes costs m*gamma. One LinkModel per class of link.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace braid::algo {

// The sizes per rank at which the link probe measures the cached figures
// and the out-of-cache ones (LinkModel::atSize).
inline constexpr size_t kCachedProbeBytes = size_t{1} << 20;
inline constexpr size_t kUncachedProbeBytes = size_t{4} << 20;

struct LinkModel {
  double alpha = 20e-6;       // seconds per message: latency plus software overhead
  double beta = 1.0 / 1.5e9;  // seconds per byte sent
  double gamma = 1.0 / 6e9;   // seconds per byte reduced (also: per byte of a local copy pass)
  // Contention. When more ranks of one host are busy at once than it has
  // cores, they share the cores and every round stretches (moving bytes
  // between processes of a host is CPU work: copies, wake-ups). alpha, beta
  // and gamma were measured with `busyWhenMeasured` ranks of a host busy,
  // so that much sharing is in them already; `contention` is how much
  // longer a round took then than with two ranks busy (1 = not measured).
  // coresPerHost 0 = never.
  int coresPerHost = 0;
  int ranksPerHost = 1;
  int busyWhenMeasured = 2;
  double contention = 1.0;
  // Out of cache. beta and contention were measured on `cachedBytes`, which
  // stay in the caches from call to call; a collective over much more moves
  // its bytes from memory, where copying is slower and ranks sharing a core
  // slow each other down less (they wait on memory, not for the core).
  // `largeBeta` and `largeContention` were measured on `largeBytes`
  // (0: not measured, the figures hold at every size).
  double cachedBytes = 0;
  double largeBytes = 0;
  double largeBeta = 0;
  double largeContention = 1.0;

  // The model for a collective over `bytes` per rank: beta and contention
  // moved from the cached figures to the large ones in step with log2 of
  // the size between the two measured sizes, and held beyond them.
  LinkModel atSize(double bytes) const {
    if (largeBytes <= cachedBytes || cachedBytes <= 0 || bytes <= cachedBytes) return *this;
    const double t =
        std::min(1.0, std::log2(bytes / cachedBytes) / std::log2(largeBytes / cachedBytes));
    LinkModel sized = *this;
    sized.beta = beta + (largeBeta - beta) * t;
    sized.contention = contention + (largeContention - contention) * t;
    return sized;
  }

  // How much longer a round takes with `active` of `nranks` ranks busy than
  // it did when measured.
  double stretch(int active, int nranks) const {
    if (coresPerHost <= 0 || nranks <= 0) return 1.0;
    const double onHost = std::ceil(static_cast<double>(active) * ranksPerHost / nranks);
    return slowdown(onHost) / slowdown(busyWhenMeasured);
  }

  // A round's time with `busy` ranks of a host busy, against two. Without a
  // measured figure, the cores are shared evenly. With one, the slowdown
  // grows in a line from none at `coresPerHost` busy ranks to the measured
  // one: on a 2-core host, 3 busy ranks made a round 2.5 times as long, not
  // the 1.5 an even share predicts (a waiting rank holds a core too).
  double slowdown(double busy) const {
    const double cores = coresPerHost;
    if (busy <= cores) return 1.0;
    if (contention <= 1.0 || busyWhenMeasured <= cores) return busy / cores;
    return 1.0 + (contention - 1.0) * (busy - cores) / (busyWhenMeasured - cores);
  }
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
