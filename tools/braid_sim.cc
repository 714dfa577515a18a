// braid-sim: what the cost model predicts for every algorithm of a
// collective, for any world size, message size and link, and which one the
// tuner would pick. With --plan it also builds rank 0's real schedule and
// counts its messages and bytes, so the model can be checked against the
// schedule it describes.
//
//   braid-sim -P 8,64,1024 --sizes 8,64K,1M,64M --alpha-us 20 --gbps 1.5
#include <cmath>
#include <cstdio>
#include <cxxopts.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/algorithm.h"
#include "src/common/byte_size.h"
#include "src/selector.h"

namespace {

using braid::algo::CollectiveArgs;
using braid::algo::CollectiveKind;

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    out.push_back(text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

size_t parseSize(const std::string& text) {
  if (std::optional<size_t> bytes = braid::parseByteSize(text)) return *bytes;
  throw std::invalid_argument("bad size '" + text + "'");
}

int parseRanks(const std::string& text) {
  size_t end = 0;
  const int ranks = text.empty() || text[0] == '-' ? 0 : std::stoi(text, &end);
  if (end != text.size() || ranks < 1)
    throw std::invalid_argument("world size must be >= 1, not '" + text + "'");
  return ranks;
}

std::string sizeText(double bytes) {
  const char* units[] = {"B", "K", "M", "G"};
  int u = 0;
  while (bytes >= 1024 && u < 3) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g%s", bytes, units[u]);
  return buf;
}

struct Measured {
  size_t messages = 0;
  double bytes = 0;
};

Measured measure(const braid::algo::Schedule& s) {
  Measured m;
  for (const auto& step : s.steps)
    if (step.kind == braid::algo::StepKind::kSend) {
      ++m.messages;
      m.bytes += static_cast<double>(step.src.bytes);
    }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options options("braid-sim",
                           "Predicted cost of every algorithm, and the tuner's choice");
  options.add_options()("P,ranks", "world sizes, comma separated",
                        cxxopts::value<std::string>()->default_value("8,64,1024"))(
      "s,sizes",
      "message sizes in bytes (K, M, G suffixes): the per-rank count times the type size",
      cxxopts::value<std::string>()->default_value("8,1K,64K,1M,16M,256M"))(
      "c,collective",
      "allreduce, broadcast, reduce, allgather, reducescatter, alltoall, gather, scatter, barrier, "
      "or all",
      cxxopts::value<std::string>()->default_value("allreduce"))(
      "alpha-us", "seconds per message, in microseconds",
      cxxopts::value<double>()->default_value("20"))(
      "gbps", "link bandwidth, GB/s", cxxopts::value<double>()->default_value("1.5"))(
      "reduce-gbps", "reduction speed, GB/s", cxxopts::value<double>()->default_value("6"))(
      "chunk-bytes", "pipelining unit", cxxopts::value<size_t>()->default_value("524288"))(
      "cores", "cores per host, for the contention term (0: ranks never outnumber cores)",
      cxxopts::value<int>()->default_value("0"))("ranks-per-host",
                                                 "ranks on each host (default: all of them on one)",
                                                 cxxopts::value<int>()->default_value("0"))(
      "contention",
      "the figures were measured with every rank of a host busy, this many times as slow as "
      "with two (the INFO line 'cost model' of a communicator; 0: measured with two)",
      cxxopts::value<double>()->default_value("0"))(
      "uncached-gbps",
      "link bandwidth out of the caches (the INFO line 'cost model out of cache'); the figures "
      "move from the cached ones at 1 MiB per rank to these at 4 MiB (0: the same at every size)",
      cxxopts::value<double>()->default_value("0"))(
      "uncached-contention", "--contention out of the caches (0: as --contention)",
      cxxopts::value<double>()->default_value("0"))(
      "plan", "also build rank 0's schedule and count its messages and bytes")("h,help",
                                                                               "this text");
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-sim: %s\n", e.what());
    return 2;
  }
  if (args.count("help")) {
    std::printf("%s\n", options.help().c_str());
    return 0;
  }
  braid::algo::LinkModel link;
  link.alpha = args["alpha-us"].as<double>() * 1e-6;
  link.beta = 1.0 / (args["gbps"].as<double>() * 1e9);
  link.gamma = 1.0 / (args["reduce-gbps"].as<double>() * 1e9);
  link.coresPerHost = args["cores"].as<int>();
  const int ranksPerHost = args["ranks-per-host"].as<int>();
  const double contention = args["contention"].as<double>();
  const double uncachedGbps = args["uncached-gbps"].as<double>();
  const double uncachedContention = args["uncached-contention"].as<double>();
  for (auto [name, value] :
       {std::pair{"contention", contention}, std::pair{"uncached-contention", uncachedContention}})
    if (value != 0 && value < 1) {
      std::fprintf(stderr, "braid-sim: --%s must be 0 or at least 1\n", name);
      return 2;
    }
  for (auto [name, value] : {std::pair{"alpha-us", link.alpha}, std::pair{"gbps", link.beta},
                             std::pair{"reduce-gbps", link.gamma}})
    if (!(value > 0) || !std::isfinite(value)) {
      std::fprintf(stderr, "braid-sim: --%s must be above 0\n", name);
      return 2;
    }
  if (uncachedGbps < 0 || (uncachedContention > 0 && uncachedGbps == 0)) {
    std::fprintf(stderr,
                 "braid-sim: --uncached-gbps must be above 0 (and is needed by "
                 "--uncached-contention)\n");
    return 2;
  }
  if (uncachedGbps > 0) {
    link.cachedBytes = braid::algo::kCachedProbeBytes;
    link.largeBytes = braid::algo::kUncachedProbeBytes;
    link.largeBeta = 1.0 / (uncachedGbps * 1e9);
  }
  std::vector<CollectiveKind> kinds;
  for (const std::string& name : split(args["collective"].as<std::string>())) {
    if (name == "all") {
      for (const char* n : {"allreduce", "broadcast", "reduce", "allgather", "reducescatter",
                            "alltoall", "gather", "scatter", "barrier"}) {
        CollectiveKind k;
        braid::collectiveFromName(n, &k);
        kinds.push_back(k);
      }
      continue;
    }
    CollectiveKind k;
    if (!braid::collectiveFromName(name, &k)) {
      std::fprintf(stderr, "braid-sim: unknown collective '%s'\n", name.c_str());
      return 2;
    }
    kinds.push_back(k);
  }
  const bool plan = args.count("plan") > 0;
  std::printf(
      "# alpha %.2f us, link %.3g GB/s, reduce %.3g GB/s, chunk %zu B; * = the tuner's choice\n",
      link.alpha * 1e6, 1e-9 / link.beta, 1e-9 / link.gamma, args["chunk-bytes"].as<size_t>());
  if (uncachedGbps > 0)
    std::printf("# out of cache (from %zu MiB per rank): link %.3g GB/s\n",
                braid::algo::kUncachedProbeBytes >> 20, uncachedGbps);
  std::printf("%-13s %6s %7s %-18s %12s %7s %12s%s\n", "# collective", "P", "size", "algorithm",
              "time (us)", "steps", "bytes/rank", plan ? "   rank0 msgs  rank0 bytes" : "");
  try {
    for (CollectiveKind kind : kinds)
      for (const std::string& p : split(args["ranks"].as<std::string>()))
        for (const std::string& size : split(args["sizes"].as<std::string>())) {
          CollectiveArgs a;
          a.kind = kind;
          a.nranks = parseRanks(p);
          a.dtype = braid::DataType::kFloat32;
          a.count = parseSize(size) / 4;
          a.chunkBytes = args["chunk-bytes"].as<size_t>();
          link.ranksPerHost = ranksPerHost > 0 ? std::min(ranksPerHost, a.nranks) : a.nranks;
          if (contention > 0) {
            link.busyWhenMeasured = link.ranksPerHost;
            link.contention = contention;
          }
          link.largeContention = uncachedContention > 0 ? uncachedContention : link.contention;
          // What the tuner weighs at this size (LinkModel::atSize).
          const braid::algo::LinkModel sized = link.atSize(static_cast<double>(a.bytes()));
          const braid::Selector selector({}, link);
          const auto& chosen = selector.choose(a);
          for (const auto& algorithm : braid::algo::allAlgorithms()) {
            if (algorithm.kind != kind) continue;
            braid::algo::Cost cost = algorithm.estimate(a, sized);
            std::printf("%-13s %6d %7s %-18s %12.1f %7d %12s",
                        std::string(braid::algo::collectiveName(kind)).c_str(), a.nranks,
                        sizeText(static_cast<double>(a.bytes())).c_str(),
                        (std::string(algorithm.name) + (&algorithm == &chosen ? " *" : "")).c_str(),
                        cost.seconds * 1e6, cost.steps, sizeText(cost.bytesSent).c_str());
            if (plan) {
              Measured m = measure(algorithm.plan(a));
              std::printf("   %11zu %12s", m.messages, sizeText(m.bytes).c_str());
            }
            std::printf("\n");
          }
        }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-sim: %s\n", e.what());
    return 2;
  }
  return 0;
}
