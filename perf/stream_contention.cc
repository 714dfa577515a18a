// Two braid streams of one communicator at once, as pipeline and data
// parallelism mix them: stream A runs large AllReduces back to back while
// stream B times a ping-pong of Send/Recv between ranks 0 and 1. Both share
// the communicator's connections, so a thread may read the other's message;
// the round trips on B show whether its thread then waits for nothing.
//
//   braidrun -n 2 build/perf/stream_contention [-n 400] [-b 4K] [-B 8M] [-k 200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cxxopts.hpp>
#include <thread>
#include <vector>

#include "braid.h"
#include "perf/perf_driver.h"

namespace {

bool ok(braidResult_t r, const char* what) {
  if (r == braidSuccess) return true;
  std::fprintf(stderr, "stream_contention: %s: %s\n", what, braidGetLastError(nullptr));
  return false;
}

int run(int argc, char** argv) {
  cxxopts::Options spec("stream_contention",
                        "Send/Recv round trips on one stream while another runs AllReduces");
  spec.add_options()("n,iters", "round trips timed", cxxopts::value<int>()->default_value("400"))(
      "b,bytes", "bytes each way per round trip (K/M suffixes)",
      cxxopts::value<std::string>()->default_value("4K"))(
      "B,background_bytes", "bytes of each AllReduce on the other stream",
      cxxopts::value<std::string>()->default_value("8M"))(
      "k,background_calls", "AllReduces on the other stream",
      cxxopts::value<int>()->default_value("200"))("h,help", "this help");
  cxxopts::ParseResult args = spec.parse(argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", spec.help().c_str());
    return 0;
  }
  const int iterations = args["iters"].as<int>();
  const size_t bytes = braid::perf::parseBytes(args["bytes"].as<std::string>());
  const size_t backgroundBytes =
      braid::perf::parseBytes(args["background_bytes"].as<std::string>());
  const int backgroundCalls = args["background_calls"].as<int>();
  if (iterations < 1 || bytes < 1 || backgroundBytes < 4 || backgroundCalls < 0) {
    std::fprintf(stderr, "stream_contention: need -n >= 1, -b >= 1, -B >= 4, -k >= 0\n");
    return 2;
  }

  braidComm_t comm = nullptr;
  if (!ok(braidCommInitFromEnv(&comm), "braidCommInitFromEnv")) return 1;
  int rank = 0, nranks = 1;
  braidCommUserRank(comm, &rank);
  braidCommCount(comm, &nranks);
  braidStream_t background = nullptr, timed = nullptr;
  if (!ok(braidStreamCreate(comm, &background), "braidStreamCreate") ||
      !ok(braidStreamCreate(comm, &timed), "braidStreamCreate"))
    return 1;

  bool backgroundOk = true;
  double backgroundSeconds = 0;
  std::thread other([&] {
    std::vector<float> data(backgroundBytes / sizeof(float), 1.0f);
    const auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < backgroundCalls && backgroundOk; ++k)
      backgroundOk = ok(braidAllReduce(data.data(), data.data(), data.size(), braidFloat32,
                                       braidSum, comm, background),
                        "braidAllReduce") &&
                     ok(braidStreamSynchronize(background), "braidStreamSynchronize");
    backgroundSeconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  // Ranks past 1 take part in the AllReduces only.
  std::vector<double> microseconds;
  std::vector<char> buffer(bytes, 1);
  bool timedOk = true;
  if (rank < 2 && nranks >= 2) {
    const int peer = 1 - rank;
    for (int i = 0; i < iterations && timedOk; ++i) {
      const auto start = std::chrono::steady_clock::now();
      for (int leg = 0; leg < 2 && timedOk; ++leg)
        timedOk = (leg == rank ? ok(braidSend(buffer.data(), bytes, braidInt8, peer, comm, timed),
                                    "braidSend")
                               : ok(braidRecv(buffer.data(), bytes, braidInt8, peer, comm, timed),
                                    "braidRecv")) &&
                  ok(braidStreamSynchronize(timed), "braidStreamSynchronize");
      microseconds.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count());
    }
  }
  other.join();
  if (rank == 0 && timedOk && !microseconds.empty()) {
    std::sort(microseconds.begin(), microseconds.end());
    const size_t n = microseconds.size();
    double total = 0;
    for (double us : microseconds) total += us;
    const auto over = std::count_if(microseconds.begin(), microseconds.end(),
                                    [](double us) { return us > 50000; });
    std::printf(
        "# %d round trips of %zu bytes on one stream, %d AllReduces of %zu bytes on another, "
        "%d ranks\n# us per round trip: median %.1f  p90 %.1f  p99 %.1f  max %.1f  over 50 ms: "
        "%ld  total %.3f s\n# AllReduces on the other stream: %.3f s, %.2f ms per call\n",
        iterations, bytes, backgroundCalls, backgroundBytes, nranks, microseconds[n / 2],
        microseconds[n * 9 / 10], microseconds[n * 99 / 100], microseconds[n - 1],
        static_cast<long>(over), total / 1e6, backgroundSeconds,
        backgroundCalls > 0 ? 1e3 * backgroundSeconds / backgroundCalls : 0.0);
  }
  braidStreamDestroy(timed);
  braidStreamDestroy(background);
  braidCommDestroy(comm);
  return timedOk && backgroundOk ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stream_contention: %s\n", e.what());
    return 2;
  }
}
