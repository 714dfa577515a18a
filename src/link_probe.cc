#include "src/link_probe.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "src/common/log.h"
#include "src/common/reduce.h"
#include "src/communicator.h"

namespace braid {

namespace {

using Clock = std::chrono::steady_clock;
using algo::BufferId;
using algo::Schedule;
using algo::Slice;
using algo::StepIndex;

// Probe schedules between ranks 0 and 1, run through the progress engine
// like any algorithm, so each figure is what a round inside a collective
// costs, not what a whole call costs. A call also pays a fixed price
// (posting, the first wake-up) that every algorithm pays once; counting it
// per round (as an exchange per call did) made a round look 2-8 times
// dearer than it is and moved every crossover towards the algorithms with
// fewer rounds.

// kRounds dependent exchanges: each rank sends once the previous round's
// message has arrived.
template <int kRounds>
Schedule planExchangeRounds(const algo::CollectiveArgs& args) {
  Schedule plan;
  const int peer = 1 - args.rank;
  const Slice out{BufferId::kSend, 0, args.bytes()};
  const Slice in{BufferId::kRecv, 0, args.bytes()};
  StepIndex arrived = algo::kNoStep;
  for (int i = 0; i < kRounds; ++i) {
    plan.send(peer, out, arrived);
    arrived = plan.recv(peer, in, arrived);
  }
  return plan;
}

// One exchange whose incoming bytes are reduced into the output, as in a
// reduce-scatter round.
Schedule planReducingExchange(const algo::CollectiveArgs& args) {
  Schedule plan;
  const int peer = 1 - args.rank;
  const Slice out{BufferId::kSend, 0, args.bytes()};
  plan.send(peer, out);
  plan.recvReduce(peer, Slice{BufferId::kRecv, 0, args.bytes()}, out);
  return plan;
}

algo::Cost noEstimate(const algo::CollectiveArgs&, const algo::LinkModel&) {
  return {};
}

const algo::Algorithm kOneRound{algo::CollectiveKind::kAllReduce, "probe: 1 round",
                                planExchangeRounds<1>, noEstimate};
const algo::Algorithm kFourRounds{algo::CollectiveKind::kAllReduce, "probe: 4 rounds",
                                  planExchangeRounds<4>, noEstimate};
const algo::Algorithm kReducingRound{algo::CollectiveKind::kAllReduce, "probe: reducing round",
                                     planReducingExchange, noEstimate};

// Seconds per call of `algorithm` over `bytes` on ranks 0 and 1: the best
// of 4 timed batches after one untimed one (page faults, cold caches, the
// first wake-ups); the least disturbed batch is the link's own figure.
Result<double> timeProbe(Communicator& comm, const algo::Algorithm& algorithm,
                         std::vector<float>& out, std::vector<float>& in, size_t bytes, int iters) {
  Operation op;
  op.args.kind = algo::CollectiveKind::kAllReduce;
  op.args.count = bytes / sizeof(float);
  op.args.dtype = DataType::kFloat32;
  op.args.op = RedOp::kSum;
  op.send = out.data();
  op.recv = in.data();
  op.algorithm = &algorithm;
  op.name = "link probe";
  double best = 1e30;
  for (int batch = 0; batch < 5; ++batch) {
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i)
      BRAID_RETURN_IF_ERROR(comm.run({&op, 1}, Communicator::kProbeStream));
    if (batch == 0) continue;
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count() / iters);
  }
  return best;
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
};

Result<Figures> measure(Communicator& comm) {
  constexpr size_t kSmall = 8, kMedium = 256 << 10, kLarge = 1 << 20;
  std::vector<float> out(kLarge / sizeof(float), 1.0f), in(kLarge / sizeof(float), 0.0f);
  BRAID_ASSIGN_OR_RETURN(double one, timeProbe(comm, kOneRound, out, in, kSmall, 50));
  BRAID_ASSIGN_OR_RETURN(double four, timeProbe(comm, kFourRounds, out, in, kSmall, 50));
  BRAID_ASSIGN_OR_RETURN(double large, timeProbe(comm, kOneRound, out, in, kLarge, 3));
  BRAID_ASSIGN_OR_RETURN(double plain, timeProbe(comm, kOneRound, out, in, kMedium, 5));
  BRAID_ASSIGN_OR_RETURN(double reducing, timeProbe(comm, kReducingRound, out, in, kMedium, 5));
  Figures f;
  f.alpha = std::max(1e-8, (four - one) / 3);
  f.beta = std::max(1e-12, (large - one) / kLarge);
  f.gamma = std::max(localReduceSecondsPerByte(), (reducing - plain) / kMedium);
  BRAID_INFO("link probe: 1 round ", one * 1e6, " us, 4 rounds ", four * 1e6, " us, 1 MiB ",
             large * 1e6, " us, 256 KiB ", plain * 1e6, " us, reduced ", reducing * 1e6, " us");
  return f;
}

}  // namespace

// The cores this process may run on: what its ranks on the host share.
int usableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

Result<algo::LinkModel> probeLink(Communicator& comm) {
  const Config& config = comm.config();
  algo::LinkModel model;
  const bool given = config.linkAlphaMicroseconds > 0 && config.linkGigabytesPerSecond > 0 &&
                     config.reduceGigabytesPerSecond > 0;
  if (comm.size() > 1) {
    // Measured on rank 0 (and 1) and shared, so that every rank chooses
    // alike: {alpha, beta, gamma, cores per host, ranks per host}.
    std::vector<double> figures = {model.alpha, model.beta, model.gamma, 0, 1};
    if (comm.rank() <= 1 && !given) {
      BRAID_ASSIGN_OR_RETURN(Figures f, measure(comm));
      figures[0] = f.alpha;
      figures[1] = f.beta;
      figures[2] = f.gamma;
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
  }
  if (config.linkAlphaMicroseconds > 0) model.alpha = config.linkAlphaMicroseconds * 1e-6;
  if (config.linkGigabytesPerSecond > 0) model.beta = 1.0 / (config.linkGigabytesPerSecond * 1e9);
  if (config.reduceGigabytesPerSecond > 0)
    model.gamma = 1.0 / (config.reduceGigabytesPerSecond * 1e9);
  return model;
}

}  // namespace braid
