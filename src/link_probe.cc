#include "src/link_probe.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "src/common/log.h"
#include "src/common/reduce.h"
#include "src/communicator.h"

namespace braid {

namespace {

using Clock = std::chrono::steady_clock;

// Seconds per round trip of `bytes` between ranks 0 and 1, best of 3
// batches (the least disturbed one is the link's own figure).
Result<double> roundTrip(Communicator& comm, std::vector<uint8_t>& buffer, size_t bytes,
                         int iters) {
  const int peer = 1 - comm.rank();
  Operation first = byteTransfer(comm.rank() == 0, peer, buffer.data(), bytes, "link probe");
  Operation second = byteTransfer(comm.rank() != 0, peer, buffer.data(), bytes, "link probe");
  double best = 1e30;
  for (int batch = 0; batch < 3; ++batch) {
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i) {
      BRAID_RETURN_IF_ERROR(comm.run({&first, 1}, 0));
      BRAID_RETURN_IF_ERROR(comm.run({&second, 1}, 0));
    }
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

Result<algo::LinkModel> probeLink(Communicator& comm) {
  const Config& config = comm.config();
  algo::LinkModel model;
  const bool given = config.linkAlphaMicroseconds > 0 && config.linkGigabytesPerSecond > 0 &&
                     config.reduceGigabytesPerSecond > 0;
  if (!given && comm.size() > 1) {
    // figures[] = {alpha, beta, gamma}, measured on rank 0 (and 1), shared.
    std::vector<double> figures = {model.alpha, model.beta, model.gamma};
    if (comm.rank() <= 1) {
      constexpr size_t kLarge = 1 << 20;
      std::vector<uint8_t> buffer(kLarge, 0);
      BRAID_ASSIGN_OR_RETURN(double small, roundTrip(comm, buffer, 8, 10));
      BRAID_ASSIGN_OR_RETURN(double large, roundTrip(comm, buffer, kLarge, 2));
      figures[0] = small / 2;
      figures[1] = std::max(1e-12, (large / 2 - figures[0]) / kLarge);
      figures[2] = reduceSecondsPerByte();
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
    model = {figures[0], figures[1], figures[2]};
  }
  if (config.linkAlphaMicroseconds > 0) model.alpha = config.linkAlphaMicroseconds * 1e-6;
  if (config.linkGigabytesPerSecond > 0) model.beta = 1.0 / (config.linkGigabytesPerSecond * 1e9);
  if (config.reduceGigabytesPerSecond > 0)
    model.gamma = 1.0 / (config.reduceGigabytesPerSecond * 1e9);
  return model;
}

}  // namespace braid
