#include "src/link_probe.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "src/common/log.h"
#include "src/common/median.h"
#include "src/common/reduce.h"
#include "src/communicator.h"

namespace braid {

namespace {

using Clock = std::chrono::steady_clock;
using algo::BufferId;
using algo::Schedule;
using algo::Slice;
using algo::StepIndex;

// Probe schedules, run through the progress engine like any algorithm, so
// each figure is what a round inside a collective costs, not what a whole
// call costs. A call also pays a fixed price (posting, the first wake-up)
// that every algorithm pays once; counting it per round (as an exchange per
// call did) made a round look 2-8 times dearer than it is and moved every
// crossover towards the algorithms with fewer rounds.
//
// The ranks args.root names (0 to root-1) form a ring: each sends to the
// next and receives from the one before, as in a round of a collective.
// With every rank of a host in it, the figures hold what sharing its cores
// costs; timed on two ranks while the others wait, they swung fivefold
// from launch to launch on a host with fewer cores than ranks, as the
// waiting ranks happened to sleep or to spin.
int nextInRing(const algo::CollectiveArgs& args) {
  return (args.rank + 1) % args.root;
}
int previousInRing(const algo::CollectiveArgs& args) {
  return (args.rank + args.root - 1) % args.root;
}

// kRounds dependent rounds: each rank sends once the previous round's
// message has arrived.
template <int kRounds>
Schedule planExchangeRounds(const algo::CollectiveArgs& args) {
  Schedule plan;
  const Slice out{BufferId::kSend, 0, args.bytes()};
  const Slice in{BufferId::kRecv, 0, args.bytes()};
  StepIndex arrived = algo::kNoStep;
  for (int i = 0; i < kRounds; ++i) {
    plan.send(nextInRing(args), out, arrived);
    arrived = plan.recv(previousInRing(args), in, arrived);
  }
  return plan;
}

// One round whose incoming bytes are reduced into the output, as in a
// reduce-scatter round.
Schedule planReducingExchange(const algo::CollectiveArgs& args) {
  Schedule plan;
  const Slice out{BufferId::kSend, 0, args.bytes()};
  plan.send(nextInRing(args), out);
  plan.recvReduce(previousInRing(args), Slice{BufferId::kRecv, 0, args.bytes()}, out);
  return plan;
}

// One round over a buffer too large for the caches, sent in pieces of the
// pipelining unit as the algorithms send it, so that the pieces take the
// path (ring or single copy) an algorithm's would; but in 16 pieces at
// most, so that a small unit does not make the probe thousands of messages.
constexpr size_t kMostPieces = 16;
size_t pieceBytes(size_t bytes, size_t chunkBytes) {
  return std::max({chunkBytes, (bytes + kMostPieces - 1) / kMostPieces, size_t{1}});
}

Schedule planChunkedRound(const algo::CollectiveArgs& args) {
  Schedule plan;
  const size_t piece = pieceBytes(args.bytes(), args.chunkBytes);
  for (size_t at = 0; at < args.bytes(); at += piece) {
    const size_t n = std::min(piece, args.bytes() - at);
    plan.send(nextInRing(args), Slice{BufferId::kSend, at, n});
    plan.recv(previousInRing(args), Slice{BufferId::kRecv, at, n});
  }
  return plan;
}

algo::Cost noEstimate(const algo::CollectiveArgs&, const algo::LinkModel&) {
  return {};
}

const algo::Algorithm kOneRound{algo::CollectiveKind::kAllReduce, "probe: 1 round",
                                planExchangeRounds<1>, noEstimate};
const algo::Algorithm kFourRounds{algo::CollectiveKind::kAllReduce, "probe: 4 rounds",
                                  planExchangeRounds<4>, noEstimate};
const algo::Algorithm kChunkedRound{algo::CollectiveKind::kAllReduce, "probe: chunked round",
                                    planChunkedRound, noEstimate};
const algo::Algorithm kReducingRound{algo::CollectiveKind::kAllReduce, "probe: reducing round",
                                     planReducingExchange, noEstimate};

// Seconds per call of `algorithm` over `bytes` on a ring of the first
// `ringSize` ranks: the best of 8 timed batches after one untimed one (page
// faults, cold caches, the first wake-ups); the least disturbed batch is
// the link's own figure. With ranks outnumbering cores, 4 batches were too
// few: a 256 KiB round sometimes took 2-3 times its usual time in all of
// them.
Operation probeOperation(int ringSize, const algo::Algorithm& algorithm, std::vector<float>& out,
                         std::vector<float>& in, size_t bytes) {
  Operation op;
  op.args.root = ringSize;
  op.args.kind = algo::CollectiveKind::kAllReduce;
  op.args.count = bytes / sizeof(float);
  op.args.dtype = DataType::kFloat32;
  op.args.op = RedOp::kSum;
  op.send = out.data();
  op.recv = in.data();
  op.algorithm = &algorithm;
  op.name = "link probe";
  return op;
}

// Seconds per call over a batch of `iters` calls.
Result<double> timeBatch(Communicator& comm, const Operation& op, int iters,
                         int stream = Communicator::kProbeStream) {
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i) BRAID_RETURN_IF_ERROR(comm.run({&op, 1}, stream));
  return std::chrono::duration<double>(Clock::now() - start).count() / iters;
}

constexpr int kBatches = 8;

Result<double> timeProbe(Communicator& comm, int ringSize, const algo::Algorithm& algorithm,
                         std::vector<float>& out, std::vector<float>& in, size_t bytes, int iters) {
  const Operation op = probeOperation(ringSize, algorithm, out, in, bytes);
  BRAID_RETURN_IF_ERROR(timeBatch(comm, op, iters).status());
  double best = 1e30;
  for (int batch = 0; batch < kBatches; ++batch) {
    BRAID_ASSIGN_OR_RETURN(double seconds, timeBatch(comm, op, iters));
    best = std::min(best, seconds);
  }
  return best;
}

// What reducing the received bytes adds to a round of `bytes`: the median,
// over batches, of a reducing batch's time less that of a plain one run
// just before it. Each figure alone is a best of batches; their difference
// was often a fifth or five times the truth, as one or the other happened
// to catch its undisturbed batch.
Result<double> timeReduction(Communicator& comm, int ringSize, std::vector<float>& out,
                             std::vector<float>& in, size_t bytes, int iters) {
  const Operation plain = probeOperation(ringSize, kOneRound, out, in, bytes);
  const Operation reducing = probeOperation(ringSize, kReducingRound, out, in, bytes);
  BRAID_RETURN_IF_ERROR(timeBatch(comm, plain, iters).status());
  BRAID_RETURN_IF_ERROR(timeBatch(comm, reducing, iters).status());
  std::vector<double> extra;
  for (int batch = 0; batch < kBatches; ++batch) {
    BRAID_ASSIGN_OR_RETURN(double without, timeBatch(comm, plain, iters));
    BRAID_ASSIGN_OR_RETURN(double with, timeBatch(comm, reducing, iters));
    extra.push_back(with - without);
  }
  std::nth_element(extra.begin(), extra.begin() + kBatches / 2, extra.end());
  return extra[kBatches / 2];
}

// Seconds per byte of an in-place float32 sum over a cache-resident 1 MiB:
// the floor of gamma, for when the engine's figure drowns in noise.
double localReduceSecondsPerByte() {
  constexpr size_t kCount = 1 << 18;
  std::vector<float> a(kCount, 1.0f), b(kCount, 2.0f);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto start = Clock::now();
    reduceElements(a.data(), a.data(), b.data(), kCount, DataType::kFloat32, RedOp::kSum);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best / (kCount * sizeof(float));
}

struct Figures {
  double alpha, beta, gamma;
  double uncachedBeta;
  // How much longer a round took with every rank of the ring busy than with
  // two (1 = not measured): in cache, and out of it.
  double contention = 1.0, uncachedContention = 1.0;
};

// A round timed with the whole ring busy, and against the same round with
// only ranks 0 and 1 busy.
struct PairedRound {
  double busy;        // seconds, the best batch with the whole ring busy
  double pair;        // seconds, the best batch with two busy (ranks 0 and 1 only)
  double contention;  // median over the batches of (whole ring / two busy)
};

// kUncachedProbeBytes: beyond the caches of the hosts at hand (a few MiB
// per core), small enough that a round takes about a millisecond.
using algo::kCachedProbeBytes;
using algo::kUncachedProbeBytes;

// The whole ring's batches and the pair's taken in turns, so that both see
// the host in the same state, and compared batch by batch. Timed one after
// the other (the pair's best of batches after the ring's), the ratio swung
// from 1.0 to 3.8 between communicators made one after another in one
// process: the third rank slept in poll(2) through the pair's batches and
// the host ran the pair at half speed in one communicator of two. Here the
// third rank waits in its next batch as a rank of a collective waits for
// its turn (polling, then sleeping), and one batch disturbed moves the
// median of the ratios less than it moved a best of batches.
Result<PairedRound> timeAgainstPair(Communicator& comm, int ringSize,
                                    const algo::Algorithm& algorithm, size_t bytes, int iters) {
  std::vector<float> out(bytes / sizeof(float), 1.0f), in(out.size(), 0.0f);
  const Operation whole = probeOperation(ringSize, algorithm, out, in, bytes);
  const Operation pair = probeOperation(2, algorithm, out, in, bytes);
  const bool inPair = comm.rank() < 2;
  BRAID_RETURN_IF_ERROR(timeBatch(comm, whole, iters).status());
  constexpr int kPairStream = Communicator::kPairProbeStream;
  if (inPair) BRAID_RETURN_IF_ERROR(timeBatch(comm, pair, iters, kPairStream).status());
  std::vector<double> wholeTimes, pairTimes;
  for (int batch = 0; batch < kBatches; ++batch) {
    BRAID_ASSIGN_OR_RETURN(double seconds, timeBatch(comm, whole, iters));
    wholeTimes.push_back(seconds);
    if (!inPair) continue;
    BRAID_ASSIGN_OR_RETURN(seconds, timeBatch(comm, pair, iters, kPairStream));
    pairTimes.push_back(seconds);
  }
  PairedRound round;
  round.busy = *std::min_element(wholeTimes.begin(), wholeTimes.end());
  round.pair = inPair ? *std::min_element(pairTimes.begin(), pairTimes.end()) : 0;
  round.contention = inPair ? std::max(1.0, medianRatio(wholeTimes, pairTimes)) : 1.0;
  return round;
}

Result<PairedRound> timeRound(Communicator& comm, int ringSize, const algo::Algorithm& algorithm,
                              size_t bytes, int iters) {
  if (ringSize > 2) return timeAgainstPair(comm, ringSize, algorithm, bytes, iters);
  std::vector<float> out(bytes / sizeof(float), 1.0f), in(out.size(), 0.0f);
  BRAID_ASSIGN_OR_RETURN(double seconds,
                         timeProbe(comm, ringSize, algorithm, out, in, bytes, iters));
  return PairedRound{seconds, seconds, 1.0};
}

Result<Figures> measure(Communicator& comm, int ringSize) {
  constexpr size_t kSmall = 8, kMedium = 256 << 10, kLarge = kCachedProbeBytes;
  std::vector<float> out(kLarge / sizeof(float), 1.0f), in(kLarge / sizeof(float), 0.0f);
  BRAID_ASSIGN_OR_RETURN(double one, timeProbe(comm, ringSize, kOneRound, out, in, kSmall, 50));
  BRAID_ASSIGN_OR_RETURN(double four, timeProbe(comm, ringSize, kFourRounds, out, in, kSmall, 50));
  BRAID_ASSIGN_OR_RETURN(PairedRound large, timeRound(comm, ringSize, kOneRound, kLarge, 5));
  BRAID_ASSIGN_OR_RETURN(double reduction, timeReduction(comm, ringSize, out, in, kMedium, 10));
  BRAID_ASSIGN_OR_RETURN(PairedRound uncached,
                         timeRound(comm, ringSize, kChunkedRound, kUncachedProbeBytes, 1));
  Figures f;
  f.alpha = std::max(1e-8, (four - one) / 3);
  f.beta = std::max(1e-12, (large.busy - one) / kLarge);
  f.contention = large.contention;
  // A reduction is one core's work. The model divides the figures by the
  // contention for rounds with two ranks busy (LinkModel::stretch), but the
  // reducing round's extra time hid partly behind the waits of ranks
  // sharing a core, so its quotient read 2-5 times as fast as this core
  // reducing alone, and the model, counting reductions nearly free, kept
  // the butterfly (which reduces the whole vector where halving reduces
  // half) to 128 KiB with 3 ranks on 2 cores, 15% slower there. The floor
  // holds in the two-busy frame.
  f.gamma = std::max(localReduceSecondsPerByte() * f.contention, reduction / kMedium);
  f.uncachedContention = uncached.contention;
  // Its pieces each pay alpha, as the model counts them.
  const double pieces = std::ceil(static_cast<double>(kUncachedProbeBytes) /
                                  pieceBytes(kUncachedProbeBytes, comm.config().chunkBytes));
  f.uncachedBeta =
      std::max(f.beta, (uncached.busy - one - (pieces - 1) * f.alpha) / kUncachedProbeBytes);
  BRAID_INFO("link probe: 1 round ", one * 1e6, " us, 4 rounds ", four * 1e6, " us, 1 MiB ",
             large.busy * 1e6, " us, ", kUncachedProbeBytes >> 20, " MiB ", uncached.busy * 1e6,
             " us, reducing 256 KiB adds ", reduction * 1e6, " us");
  if (ringSize > 2 && comm.rank() < 2)
    BRAID_INFO("link probe: 1 MiB ", large.pair * 1e6, " us with 2 ranks busy, ", large.busy * 1e6,
               " us with ", ringSize, " (", f.contention, "x batch by batch); ",
               kUncachedProbeBytes >> 20, " MiB ", uncached.pair * 1e6, " us with 2, ",
               uncached.busy * 1e6, " us with ", ringSize, " (", f.uncachedContention, "x)");
  return f;
}

}  // namespace

double medianRatio(const std::vector<double>& numerators, const std::vector<double>& denominators) {
  std::vector<double> ratios;
  for (size_t i = 0; i < std::min(numerators.size(), denominators.size()); ++i)
    if (denominators[i] > 0) ratios.push_back(numerators[i] / denominators[i]);
  return ratios.empty() ? 1.0 : median(std::move(ratios));
}

// The cores this process may run on: what its ranks on the host share.
int usableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

Result<algo::LinkModel> probeLink(Communicator& comm, const algo::LinkModel* parentLink) {
  const Config& config = comm.config();
  if (parentLink != nullptr) {
    // The parent's figures include the given ones already (same config).
    algo::LinkModel model = *parentLink;
    model.ranksPerHost = comm.ranksOnHostOf(0);
    return model;
  }
  algo::LinkModel model;
  const bool given = config.linkAlphaMicroseconds > 0 && config.linkGigabytesPerSecond > 0 &&
                     config.reduceGigabytesPerSecond > 0;
  if (comm.size() > 1) {
    // Every rank when they share one host, so that the figures hold the
    // contention for its cores; else ranks 0 and 1 (what sharing a host
    // costs is then left to LinkModel::stretch).
    const bool oneHost = comm.ranksOnHostOf(0) == comm.size();
    const int ringSize = oneHost ? comm.size() : 2;
    // Measured and shared by rank 0, so that every rank chooses alike:
    // {alpha, beta, gamma, cores per host, ranks per host, busy ranks,
    //  contention, beta out of cache, contention out of cache}.
    std::vector<double> figures = {
        model.alpha, model.beta, model.gamma, 0, 1, static_cast<double>(ringSize), 1, 0, 1};
    if (comm.rank() < ringSize && !given) {
      BRAID_ASSIGN_OR_RETURN(Figures f, measure(comm, ringSize));
      figures[0] = f.alpha;
      figures[1] = f.beta;
      figures[2] = f.gamma;
      figures[7] = f.uncachedBeta;
      // How much the host's sharing stretched a round (LinkModel::slowdown).
      figures[6] = f.contention;
      figures[8] = f.uncachedContention;
    }
    if (comm.rank() == 0) {
      figures[3] = comm.coresOnHostOf(0) > 0 ? comm.coresOnHostOf(0) : usableCores();
      figures[4] = comm.ranksOnHostOf(0);
    }
    Operation share;
    share.args.kind = algo::CollectiveKind::kBroadcast;
    share.args.count = figures.size();
    share.args.dtype = DataType::kFloat64;
    share.args.root = 0;
    share.args.inPlace = comm.rank() == 0;
    share.send = figures.data();
    share.recv = figures.data();
    share.name = "link probe";
    BRAID_RETURN_IF_ERROR(comm.run({&share, 1}, 0));
    model.alpha = figures[0];
    model.beta = figures[1];
    model.gamma = figures[2];
    model.coresPerHost = static_cast<int>(figures[3]);
    model.ranksPerHost = static_cast<int>(figures[4]);
    model.busyWhenMeasured = given ? 2 : static_cast<int>(figures[5]);
    model.contention = given ? 1.0 : figures[6];
    if (!given && figures[7] > 0) {
      model.cachedBytes = kCachedProbeBytes;
      model.largeBytes = kUncachedProbeBytes;
      model.largeBeta = figures[7];
      model.largeContention = figures[8];
    }
  }
  if (config.linkAlphaMicroseconds > 0) model.alpha = config.linkAlphaMicroseconds * 1e-6;
  if (config.linkGigabytesPerSecond > 0) {
    model.beta = 1.0 / (config.linkGigabytesPerSecond * 1e9);
    model.largeBytes = 0;  // the given bandwidth holds at every size
  }
  if (config.reduceGigabytesPerSecond > 0)
    model.gamma = 1.0 / (config.reduceGigabytesPerSecond * 1e9);
  return model;
}

}  // namespace braid
