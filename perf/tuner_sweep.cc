// tuner_sweep: the AllReduce tuner's pick against every algorithm, timed
// side by side inside one launch.
//
// This machine's speed changes from one launch to the next (cache modes,
// neighbours), by more than the differences between algorithms, so timing
// each algorithm in its own launch compares launches, not algorithms. Here
// every rank holds one communicator per configuration (the tuner's, and one
// per forced algorithm, each made with its own BRAID_ALGO), and each
// repetition times them all back to back, in an order shuffled the same way
// on every rank. perf/tuner_check.py runs this over several launches.
// With -T, a timing holds enough calls to last that long: on this machine a
// timing of ten 8 KiB calls at 4 ranks on 2 cores took three times as long
// per call as one of a hundred.
//
//   braidrun -n 3 build/perf/tuner_sweep -b 8 -e 64M -f 2 -n 20 -r 5 -T 2000 --json out.json
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cxxopts.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "braid.h"
#include "perf_driver.h"

namespace {

constexpr const char* kAlgorithms[] = {"ring", "butterfly", "halving", "dbtree"};

struct Configuration {
  std::string name;  // "tuner" or a forced algorithm
  braidComm_t comm = nullptr;
};

bool check(braidResult_t result, braidComm_t comm, const char* what) {
  if (result == braidSuccess) return true;
  std::fprintf(stderr, "tuner_sweep: %s: %s (%s)\n", what, braidGetErrorString(result),
               comm ? braidGetLastError(comm) : braidGetLastError(nullptr));
  return false;
}

// A communicator whose AllReduce runs `algorithm` ("" = the tuner's choice),
// bootstrapped through `base` so that no second launcher address is needed.
bool makeCommunicator(braidComm_t base, int rank, int nranks, const std::string& algorithm,
                      braidComm_t* comm) {
  braidUniqueId id{};
  if (rank == 0 && !check(braidGetUniqueId(&id), nullptr, "braidGetUniqueId")) return false;
  if (!check(braidBroadcast(&id, &id, sizeof(id), braidUint8, 0, base, nullptr), base,
             "broadcast of the unique id"))
    return false;
  // BRAID_ALGO is read once, at init, into the communicator's configuration.
  if (algorithm.empty())
    unsetenv("BRAID_ALGO");
  else
    setenv("BRAID_ALGO", ("allreduce=" + algorithm).c_str(), 1);
  const bool made = check(braidCommInitRank(comm, nranks, id, rank), nullptr, "braidCommInitRank");
  unsetenv("BRAID_ALGO");
  return made;
}

// Seconds per call of `iterations` AllReduces on `comm`, the slowest rank's.
// The ranks agree on it over `base`: an AllReduce of the times on `comm`
// itself would become its last algorithm, which the tuner's row reports.
bool timeCalls(braidComm_t base, braidComm_t comm, const float* send, float* recv, size_t count,
               int iterations, double* seconds) {
  if (!check(braidBarrier(comm, nullptr), comm, "barrier")) return false;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i)
    if (!check(braidAllReduce(send, recv, count, braidFloat32, braidSum, comm, nullptr), comm,
               "allreduce"))
      return false;
  double mine =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
  if (!check(braidAllReduce(&mine, seconds, 1, braidFloat64, braidMax, base, nullptr), base,
             "allreduce of the times"))
    return false;
  return true;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

int run(int argc, char** argv) {
  cxxopts::Options spec("tuner_sweep", "AllReduce: the tuner's pick against every algorithm");
  spec.add_options()("b,minbytes", "smallest size (K/M/G suffixes)",
                     cxxopts::value<std::string>()->default_value("8"))(
      "e,maxbytes", "largest size", cxxopts::value<std::string>()->default_value("64M"))(
      "f,stepfactor", "size factor", cxxopts::value<int>()->default_value("2"))(
      "n,iters", "calls per timing, at least", cxxopts::value<int>()->default_value("20"))(
      "T,min_time_us",
      "more calls per timing where the warm-up shows that -n calls would take less than this",
      cxxopts::value<double>()->default_value("0"))("w,warmup_iters",
                                                    "untimed calls per configuration and size",
                                                    cxxopts::value<int>()->default_value("3"))(
      "r,reps", "timings per configuration and size, interleaved",
      cxxopts::value<int>()->default_value("5"))("J,json", "write the medians to this file",
                                                 cxxopts::value<std::string>()->default_value(""))(
      "h,help", "this help");
  cxxopts::ParseResult args = spec.parse(argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", spec.help().c_str());
    return 0;
  }
  const size_t minBytes = braid::perf::parseBytes(args["minbytes"].as<std::string>());
  const size_t maxBytes = braid::perf::parseBytes(args["maxbytes"].as<std::string>());
  const int factor = args["stepfactor"].as<int>();
  const int iterations = args["iters"].as<int>();
  const int warmup = args["warmup_iters"].as<int>();
  const int reps = args["reps"].as<int>();
  const double minTimeUs = args["min_time_us"].as<double>();
  if (minBytes < 4 || maxBytes < minBytes || factor < 2 || iterations < 1 || warmup < 0 ||
      reps < 1 || !(minTimeUs >= 0) || (minTimeUs > 0 && warmup < 1)) {
    std::fprintf(stderr,
                 "tuner_sweep: need 4 <= -b <= -e, -f >= 2, -n >= 1, -w >= 0, -r >= 1, -T >= 0 "
                 "(and -w >= 1 with -T)\n");
    return 2;
  }

  braidComm_t base = nullptr;
  if (!check(braidCommInitFromEnv(&base), nullptr, "braidCommInitFromEnv")) return 1;
  int rank = 0, nranks = 1;
  braidCommUserRank(base, &rank);
  braidCommCount(base, &nranks);

  std::vector<Configuration> configurations{{"tuner"}};
  for (const char* algorithm : kAlgorithms) configurations.push_back({algorithm});
  for (Configuration& c : configurations)
    if (!makeCommunicator(base, rank, nranks, c.name == "tuner" ? "" : c.name, &c.comm)) return 1;

  std::vector<float> send(maxBytes / sizeof(float), 1.0f), recv(send.size());
  std::mt19937 shuffle(12345);  // the same order on every rank
  nlohmann::json record = {{"nranks", nranks}, {"iters", iterations}, {"reps", reps}, {"rows", {}}};
  if (rank == 0) {
    std::printf("# %d ranks; median us per call over %d interleaved timings of %d calls or more\n",
                nranks, reps, iterations);
    std::printf("%10s", "size");
    for (const Configuration& c : configurations) std::printf(" %10s", c.name.c_str());
    std::printf(" %10s %6s\n", "picked", "ratio");
  }
  for (size_t bytes = minBytes; bytes <= maxBytes; bytes *= factor) {
    const size_t count = bytes / sizeof(float);
    std::vector<std::vector<double>> times(configurations.size());
    // The warm-up also says how long a call takes: with ranks outnumbering
    // cores, a timing of a few short calls mostly measures how staggered the
    // ranks left the barrier, so short calls are timed in longer runs.
    double slowestWarmUp = 0;
    for (Configuration& c : configurations) {
      double perCall = 0;
      if (warmup > 0 && !timeCalls(base, c.comm, send.data(), recv.data(), count, warmup, &perCall))
        return 1;
      slowestWarmUp = std::max(slowestWarmUp, perCall);
    }
    int callsPerTiming = iterations;
    if (minTimeUs > 0 && slowestWarmUp > 0)
      callsPerTiming = std::max<int>(
          iterations, static_cast<int>(std::min(1e5, std::ceil(minTimeUs * 1e-6 / slowestWarmUp))));
    std::vector<size_t> order(configurations.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    for (int rep = 0; rep < reps; ++rep) {
      std::shuffle(order.begin(), order.end(), shuffle);
      for (size_t index : order) {
        double seconds = 0;
        if (!timeCalls(base, configurations[index].comm, send.data(), recv.data(), count,
                       callsPerTiming, &seconds))
          return 1;
        times[index].push_back(seconds * 1e6);
      }
    }
    const char* picked = "";
    braidCommGetLastAlgorithm(configurations[0].comm, "allreduce", &picked);
    double fastest = 0, pickedTime = 0;
    nlohmann::json row = {
        {"bytes", bytes}, {"picked", picked}, {"calls_per_timing", callsPerTiming}};
    for (size_t i = 0; i < configurations.size(); ++i) {
      const double us = median(times[i]);
      row["us"][configurations[i].name] = us;
      if (i == 0) continue;
      if (fastest == 0 || us < fastest) fastest = us;
      if (configurations[i].name == picked) pickedTime = us;
    }
    // A pick no configuration can force (the shared-memory board of a
    // single host, docs/ARCHITECTURE.md) is judged by the tuner's own time.
    if (pickedTime == 0) pickedTime = row["us"]["tuner"].get<double>();
    row["ratio"] = pickedTime / fastest;
    if (rank == 0) {
      std::printf("%10zu", bytes);
      for (const Configuration& c : configurations)
        std::printf(" %10.1f", row["us"][c.name].get<double>());
      std::printf(" %10s %6.2f\n", picked, pickedTime / fastest);
      std::fflush(stdout);
    }
    record["rows"].push_back(row);
  }
  for (Configuration& c : configurations) braidCommDestroy(c.comm);
  braidCommDestroy(base);
  const std::string jsonPath = args["json"].as<std::string>();
  if (rank == 0 && !jsonPath.empty()) std::ofstream(jsonPath) << record.dump(1) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "tuner_sweep: %s (see --help)\n", error.what());
    return 2;
  }
}
