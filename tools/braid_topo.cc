// braid-topo: what braid sees of the machine, and the transport it would
// pick between every pair of ranks.
//
//   braid-topo [--json]                 this process
//   braid-topo --file topo.json         every rank of a topology file
//   braidrun -n 4 braid-topo [--json]   every rank of the job, printed by rank 0
//
// Under a launcher it joins the job through the public API and gathers each
// rank's encoded description, exactly as a communicator's init would.
#include <braid.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cxxopts.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/common/env.h"
#include "src/common/strcat.h"
#include "topology/topology.h"
#include "topology/topology_json.h"
#include "transports/ib/rdma_probe.h"
#include "transports/shm/shm_segment.h"
#include "transports/shm/shm_stream.h"

namespace {

namespace topo = braid::topo;
using json = nlohmann::ordered_json;

// The transports this build of libbraid has besides tcp. cuda_ipc and ib
// appear here once libbraid carries them; --available previews them.
constexpr const char* kBuiltTransports = "shm";

struct Options {
  bool json = false;
  bool standalone = false;
  std::string file;
  std::string forced;
  topo::TransportSet available;
  // /dev/shm's room, read before this process's communicator takes any,
  // and the ring size the settings ask for (BRAID_SHM_BYTES).
  braid::Result<size_t> shmFreeBytes = size_t{0};
  size_t shmRingBytes = 0;
  bool shmRingAuto = true;
};

// What the ranks of rank 0's host would get as shared-memory rings.
struct ShmRings {
  int ranksOnHost = 1;
  size_t ringBytes = 0;
  int fullRingsUpTo = 0;  // auto: the most ranks a host that keep the preferred size
};

ShmRings shmRings(const Options& options, const std::vector<topo::RankTopology>& ranks) {
  ShmRings rings;
  rings.ranksOnHost =
      static_cast<int>(std::count_if(ranks.begin(), ranks.end(), [&](const topo::RankTopology& r) {
        return r.hostId == ranks[0].hostId;
      }));
  rings.ringBytes = options.shmRingBytes;
  if (!options.shmRingAuto || !options.shmFreeBytes.isOk()) return rings;
  const size_t room = options.shmFreeBytes.value();
  rings.ringBytes = braid::shm::fittedRingBytes(options.shmRingBytes, room, rings.ranksOnHost);
  while (rings.fullRingsUpTo < 1 << 20 &&
         braid::shm::fittedRingBytes(options.shmRingBytes, room, rings.fullRingsUpTo + 1) ==
             options.shmRingBytes)
    ++rings.fullRingsUpTo;
  return rings;
}

std::string shmText(const Options& options, const ShmRings& rings) {
  if (!options.shmFreeBytes.isOk())
    return braid::strCat("shared memory: ", options.shmFreeBytes.status().message(), "\n");
  std::string text = braid::strCat("shared memory: /dev/shm has ",
                                   options.shmFreeBytes.value() >> 20, " MiB free; ");
  if (!options.shmRingAuto)
    return text + braid::strCat("rings of ", rings.ringBytes, " bytes (BRAID_SHM_BYTES)\n");
  text += braid::strCat(options.shmRingBytes >> 20, " MiB rings for up to ", rings.fullRingsUpTo,
                        " ranks a host");
  if (rings.ranksOnHost > 1)
    text += braid::strCat("; rings of ", rings.ringBytes, " bytes for the ", rings.ranksOnHost,
                          " ranks of rank 0's host");
  return text + " (BRAID_SHM_BYTES auto)\n";
}

json shmJson(const Options& options, const ShmRings& rings) {
  if (!options.shmFreeBytes.isOk()) return {{"error", options.shmFreeBytes.status().message()}};
  json out = {{"free_bytes", options.shmFreeBytes.value()},
              {"auto", options.shmRingAuto},
              {"ranks_on_host", rings.ranksOnHost},
              {"ring_bytes", rings.ringBytes}};
  if (options.shmRingAuto) out["full_rings_up_to"] = rings.fullRingsUpTo;
  return out;
}

bool launched() {
  auto set = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0';
  };
  if (set("BRAID_WORLD_SIZE") || set("WORLD_SIZE") || set("OMPI_COMM_WORLD_SIZE")) return true;
  // An interactive allocation sets SLURM_NTASKS without anything to join.
  return set("SLURM_NTASKS") && (set("BRAID_ADDR") || set("MASTER_ADDR"));
}

braid::Result<topo::TransportSet> parseAvailable(const std::string& list) {
  topo::TransportSet set{false, false, false};
  size_t pos = 0;
  while (pos <= list.size() && !list.empty()) {
    size_t comma = list.find(',', pos);
    std::string name = list.substr(pos, comma == std::string::npos ? comma : comma - pos);
    BRAID_ASSIGN_OR_RETURN(topo::Transport t, topo::parseTransport(name));
    set.cudaIpc = set.cudaIpc || t == topo::Transport::kCudaIpc;
    set.shm = set.shm || t == topo::Transport::kShm;
    set.ib = set.ib || t == topo::Transport::kIb;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return set;
}

std::string describeDevices(const topo::RankTopology& r) {
  std::string out;
  for (const auto& d : r.devices) {
    char line[128];
    std::snprintf(line, sizeof(line), "    %-3s  %s  %04x:%04x  NUMA %s",
                  std::string(topo::deviceKindName(d.kind)).c_str(), d.busId.c_str(), d.vendor,
                  d.device, d.numaNode < 0 ? "?" : std::to_string(d.numaNode).c_str());
    out += line;
    for (const auto& n : d.netNames) out += braid::strCat("  net ", n);
    for (const auto& n : d.ibNames) out += braid::strCat("  ib ", n);
    if (!d.uuid.empty()) out += braid::strCat("  ", d.uuid);
    out += '\n';
  }
  return out;
}

std::string setText(const topo::TransportSet& set) {
  std::string out;
  for (const auto& name : topo::toJsonValue(set))
    out += (out.empty() ? "" : ", ") + name.get<std::string>();
  return out;
}

// The verbs devices and ports this process sees, or why it sees none.
json rdmaJson(const braid::ib::RdmaProbe& probe) {
  json devices = json::array();
  for (const auto& d : probe.devices) {
    json ports = json::array();
    for (const auto& p : d.ports)
      ports.push_back({{"port", p.number},
                       {"state", p.state},
                       {"link_layer", p.linkLayer},
                       {"lid", p.lid},
                       {"gids", p.gidCount}});
    devices.push_back({{"name", d.name}, {"ports", std::move(ports)}});
  }
  json out = {{"available", probe.available()}, {"devices", std::move(devices)}};
  if (!probe.available()) out["reason"] = probe.unavailable;
  return out;
}

// Prints everything; returns the exit status (1 when no matrix exists).
int report(const Options& options, const std::vector<topo::RankTopology>& ranks,
           std::string_view source) {
  auto matrix = topo::chooseTransports(ranks, options.available, options.forced);
  if (options.json) {
    json doc = {{"source", source}};
    json list = json::array();
    for (size_t i = 0; i < ranks.size(); ++i) {
      json r = {{"rank", i}};
      r.update(topo::toJsonValue(ranks[i]));
      list.push_back(std::move(r));
    }
    doc["ranks"] = std::move(list);
    doc["available"] = topo::toJsonValue(options.available);
    doc["rdma"] = rdmaJson(braid::ib::probeRdma());
    doc["forced"] = options.forced;
    doc["shm"] = shmJson(options, shmRings(options, ranks));
    if (matrix.isOk()) {
      doc["matrix"] = topo::toJsonValue(matrix.value());
    } else {
      doc["matrix"] = nullptr;
      doc["error"] = matrix.status().message();
    }
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    std::string out =
        braid::strCat(ranks.size(), ranks.size() == 1 ? " rank" : " ranks", " (", source, ")\n");
    for (size_t i = 0; i < ranks.size(); ++i)
      out += braid::strCat("rank ", i, ": ", ranks[i].summary(), '\n', describeDevices(ranks[i]));
    out += braid::strCat("transports available: ", setText(options.available),
                         "; forced: ", options.forced.empty() ? "no" : options.forced, "\n");
    out += shmText(options, shmRings(options, ranks));
    out +=
        braid::strCat("rdma (this process): ", braid::ib::describe(braid::ib::probeRdma()), "\n\n");
    if (matrix.isOk()) out += matrix->toText();
    std::fputs(out.c_str(), stdout);
  }
  std::fflush(stdout);
  if (!matrix.isOk()) {
    std::fprintf(stderr, "braid-topo: %s\n", matrix.status().message().c_str());
    return 1;
  }
  return 0;
}

int fail(const std::string& message) {
  std::fprintf(stderr, "braid-topo: %s\n", message.c_str());
  return 1;
}

int runStandalone(const Options& options, const braid::Config& config) {
  if (options.file.empty()) {
    return report(options, {topo::detect({.hostId = config.hostId})}, "detected");
  }
  auto file = topo::loadTopologyFile(options.file);
  if (!file.isOk()) return fail(file.status().message());
  return report(options, file->ranks, options.file);
}

int runLaunched(const Options& options, braid::Config config) {
  braidComm_t comm = nullptr;
  if (braidCommInitFromEnv(&comm) != braidSuccess) return fail(braidGetLastError(nullptr));
  int rank = 0, size = 0;
  braidCommUserRank(comm, &rank);
  braidCommCount(comm, &size);
  config.topoFile = options.file;
  auto local = topo::localTopology(config, rank, size);
  int status = 0;
  std::vector<char> mine(topo::kMaxEncodedBytes, '\0');
  std::vector<char> all(mine.size() * static_cast<size_t>(size));
  if (!local.isOk()) {
    // Still take part, so that the others fail on the empty slot instead of waiting.
    status = fail(local.status().message());
  } else if (std::string encoded = local->encode(); encoded.size() > mine.size()) {
    status = fail(braid::strCat("this rank's description is ", encoded.size(),
                                " bytes encoded; at most ", mine.size(), " fit"));
  } else {
    std::copy(encoded.begin(), encoded.end(), mine.begin());
  }
  if (braidAllGather(mine.data(), all.data(), mine.size(), braidUint8, comm, nullptr) !=
      braidSuccess) {
    status = fail(braidGetLastError(comm));
  } else if (status == 0) {
    std::vector<topo::RankTopology> ranks;
    for (int r = 0; r < size && status == 0; ++r) {
      auto decoded =
          topo::RankTopology::decode(std::string_view(&all[r * mine.size()], mine.size()));
      if (!decoded.isOk())
        status = fail(braid::strCat("rank ", r, ": ", decoded.status().message()));
      else
        ranks.push_back(std::move(decoded).value());
    }
    if (status == 0 && rank == 0)
      status = report(options, ranks, options.file.empty() ? "detected" : options.file);
  }
  braidCommDestroy(comm);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  cxxopts::Options spec("braid-topo",
                        "The topology braid detects and the transport of every pair of ranks");
  spec.add_options()("json", "print JSON instead of text")(
      "f,file", "rank descriptions from this JSON file instead of detection (BRAID_TOPO_FILE)",
      cxxopts::value<std::string>())("t,transport",
                                     "force a transport for every pair, as BRAID_TRANSPORT does",
                                     cxxopts::value<std::string>())(
      "available", "transports besides tcp that the build offers, comma separated",
      cxxopts::value<std::string>()->default_value(kBuiltTransports))(
      "standalone", "describe this process only, even when started by a launcher")("h,help",
                                                                                   "this text");
  cxxopts::ParseResult args;
  try {
    args = spec.parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "braid-topo: %s\n", e.what());
    return 2;
  }
  if (args.count("help")) {
    std::printf("%s\n", spec.help().c_str());
    return 0;
  }
  if (!args.unmatched().empty()) {
    std::fprintf(stderr, "braid-topo: unexpected argument '%s'\n", args.unmatched()[0].c_str());
    return 2;
  }
  auto config = braid::loadConfig();
  if (!config.isOk()) return fail(config.status().message());
  Options options;
  options.json = args.count("json") > 0;
  options.standalone = args.count("standalone") > 0;
  options.file = args.count("file") ? args["file"].as<std::string>() : config->topoFile;
  options.forced =
      args.count("transport") ? args["transport"].as<std::string>() : config->transport;
  auto available = parseAvailable(args["available"].as<std::string>());
  if (!available.isOk()) {
    std::fprintf(stderr, "braid-topo: --available: %s\n", available.status().message().c_str());
    return 2;
  }
  options.available = available.value();
  options.shmFreeBytes = braid::shm::Segment::freeBytes();
  options.shmRingBytes = config->shmRingBytes;
  options.shmRingAuto = config->shmRingAuto;
  if (!options.standalone && launched()) return runLaunched(options, config.value());
  return runStandalone(options, config.value());
}
