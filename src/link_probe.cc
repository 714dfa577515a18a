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

// Seconds per exchange of `bytes` between ranks 0 and 1 (each sends and
// receives at once, as in a round of almost every algorithm: with copies
// done by the CPU, a rank that sends and receives pays for both), best of
// 4 batches (the least disturbed one is the link's own figure).
Result<double> exchange(Communicator& comm, std::vector<uint8_t>& out, std::vector<uint8_t>& in,
                        size_t bytes, int iters) {
  const int peer = 1 - comm.rank();
  Operation both[2] = {byteTransfer(true, peer, out.data(), bytes, "link probe"),
                       byteTransfer(false, peer, in.data(), bytes, "link probe")};
  // One unmeasured batch first: page faults, cold caches, the first
  // wake-ups.
  double best = 1e30;
  for (int batch = 0; batch < 5; ++batch) {
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i) BRAID_RETURN_IF_ERROR(comm.run(both, 0));
    if (batch == 0) continue;
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count() / iters);
  }
  return best;
}

double reduceSecondsPerByte() {
  constexpr size_t kCount = 1 << 18;  // 1 MiB of float32
  std::vector<float> a(kCount, 1.0f), b(kCount, 2.0f);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto start = Clock::now();
    reduceElements(a.data(), a.data(), b.data(), kCount, DataType::kFloat32, RedOp::kSum);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best / (kCount * sizeof(float));
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
      constexpr size_t kLarge = 1 << 20;
      std::vector<uint8_t> out(kLarge, 0), in(kLarge, 0);
      BRAID_ASSIGN_OR_RETURN(double small, exchange(comm, out, in, 8, 50));
      BRAID_ASSIGN_OR_RETURN(double large, exchange(comm, out, in, kLarge, 3));
      figures[0] = small;
      figures[1] = std::max(1e-12, (large - small) / kLarge);
      figures[2] = reduceSecondsPerByte();
    }
    if (comm.rank() == 0) {
      figures[3] = usableCores();
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
