// The soak's plan: each call, and each epoch's configuration and faults, derived from the seed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "soak.h"

namespace soak {

// ---------------------------------------------------------------------------
// Deterministic choices: every rank derives the same call from (seed, index).

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const char* kKindNames[] = {"AllReduce", "Broadcast", "Reduce",  "AllGather", "ReduceScatter",
                            "AllToAll",  "Gather",    "Scatter", "SendRecv",  "Barrier"};
// Percent of calls of each kind.
const int kKindWeights[] = {24, 12, 10, 12, 12, 10, 3, 3, 9, 5};

size_t typeSize(braidDataType_t t) {
  switch (t) {
    case braidInt8:
    case braidUint8:
      return 1;
    case braidFloat16:
    case braidBfloat16:
      return 2;
    case braidInt32:
    case braidUint32:
    case braidFloat32:
      return 4;
    default:
      return 8;
  }
}

bool reduces(Kind k) {
  return k == Kind::kAllReduce || k == Kind::kReduce || k == Kind::kReduceScatter;
}

// Buffers of `count` elements per part, `parts` parts.
size_t partsOf(Kind k, int nranks) {
  switch (k) {
    case Kind::kAllGather:
    case Kind::kReduceScatter:
    case Kind::kAllToAll:
    case Kind::kGather:
    case Kind::kScatter:
      return static_cast<size_t>(nranks);
    default:
      return 1;
  }
}

Call makeCall(const Options& o, int64_t index) {
  Dice d(o.seed * 0x100000001b3ull + static_cast<uint64_t>(index));
  Call c;
  c.index = index;
  int pick = static_cast<int>(d.below(100));
  int k = 0;
  while (pick >= kKindWeights[k]) pick -= kKindWeights[k++];
  c.kind = static_cast<Kind>(k);
  c.dtype = static_cast<braidDataType_t>(d.below(braidNumTypes));
  c.op = reduces(c.kind) ? static_cast<braidRedOp_t>(d.below(braidNumOps)) : braidSum;
  c.root = static_cast<int>(d.below(o.ranks));
  c.shift = 1 + static_cast<int>(d.below(o.ranks - 1));
  c.inPlace = d.below(2) == 0 && c.kind != Kind::kAllToAll && c.kind != Kind::kSendRecv;
  // Mostly small; one in five up to 64 KiB, one in fifty up to the
  // largest buffer. Log-uniform within each class.
  const double r = d.uniform();
  double lo = 1, hi = 1024;
  if (r >= 0.98) {
    lo = 65536, hi = static_cast<double>(o.maxBytes);
  } else if (r >= 0.80) {
    lo = 1024, hi = 65536;
  }
  hi = std::min(hi, static_cast<double>(o.maxBytes));
  lo = std::min(lo, hi);
  size_t bytes = static_cast<size_t>(std::exp(std::log(lo) + d.uniform() * std::log(hi / lo)));
  bytes = std::min(bytes, o.maxBytes);
  if (d.below(50) == 0) bytes = 0;  // count 0 returns at once
  c.count = bytes / typeSize(c.dtype) / partsOf(c.kind, o.ranks);
  return c;
}

// What an epoch's communicator is made with: transport, forced algorithms,
// chunking, single copy, and the faults' seed.
// `rank`: whose environment (-1: the coordinator's summary only).
std::vector<std::pair<std::string, std::string>> epochEnvironment(const Options& o, int epoch,
                                                                  int rank, std::string* summary) {
  Dice d(o.seed * 7919 + static_cast<uint64_t>(epoch) * 104729 + 1);
  std::vector<std::pair<std::string, std::string>> env;
  // Every pair over shared memory, every pair over TCP, or both: ranks split
  // between two pretend hosts, shared memory within each and TCP across.
  const int transport = static_cast<int>(d.below(3));
  const uint64_t hostBits = d.bits();
  env.push_back({"BRAID_TRANSPORT", transport == 0 ? "shm" : transport == 1 ? "tcp" : ""});
  env.push_back({"BRAID_HOSTID", transport == 2 && rank >= 0
                                     ? "soak-host-" + std::to_string(hostBits >> rank & 1)
                                     : ""});
  if (transport == 2) *summary += "TRANSPORT=mixed ";
  static const std::vector<std::pair<std::string, std::vector<std::string>>> algorithms = {
      {"allreduce", {"ring", "butterfly", "halving", "dbtree"}},
      {"broadcast", {"tree", "chain", "scatter_allgather"}},
      {"reduce", {"tree", "rs_gather"}},
      {"allgather", {"ring", "doubling", "bruck"}},
      {"reducescatter", {"ring", "halving"}},
      {"alltoall", {"pairwise", "bruck"}},
      {"gather", {"linear", "binomial"}},
      {"scatter", {"linear", "binomial"}}};
  std::string algo;
  for (const auto& [collective, names] : algorithms) {
    if (d.below(4) == 0) continue;  // the cost model chooses
    algo += (algo.empty() ? "" : ",") + collective + "=" + names[d.below(names.size())];
  }
  env.push_back({"BRAID_ALGO", algo});
  // Where the cost model chooses, it may instead time every algorithm.
  env.push_back({"BRAID_TUNE", d.below(4) == 0 ? "measure" : "model"});
  const char* chunks[] = {"4096", "65536", "524288"};
  env.push_back({"BRAID_CHUNK_BYTES", chunks[d.below(3)]});
  // Small rings wrap often; single copy from 64 KiB moves large messages
  // as descriptors (where the kernel lets ranks read each other).
  const char* rings[] = {"65536", "1048576"};
  env.push_back({"BRAID_SHM_BYTES", rings[d.below(2)]});
  const char* cma[] = {"auto", "65536", "0"};
  env.push_back({"BRAID_SHM_CMA_BYTES", cma[d.below(3)]});
  // Mostly the cost model's figures are given; otherwise init measures the
  // link between ranks 0 and 1, through the faults, and may fail.
  const bool measure = d.below(4) == 0;
  env.push_back({"BRAID_LINK_ALPHA_US", measure ? "" : "20"});
  env.push_back({"BRAID_LINK_GBPS", measure ? "" : "2"});
  env.push_back({"BRAID_REDUCE_GBPS", measure ? "" : "4"});
  if (!o.faults.empty())
    env.push_back({"BRAID_FAULTS", o.faults + ",seed=" + std::to_string(o.seed * 100003 + epoch)});
  for (const auto& [k, v] : env)
    if (k != "BRAID_FAULTS" && !k.starts_with("BRAID_LINK") && k != "BRAID_REDUCE_GBPS" &&
        k != "BRAID_HOSTID" && !v.empty())
      *summary += k.substr(6) + "=" + v + " ";
  if (measure) *summary += "measured link ";
  return env;
}

// The probability of `kind` ("drop", "close") in a BRAID_FAULTS value.
double faultRate(const std::string& faults, const std::string& kind) {
  const std::string key = kind + "=";
  for (size_t at = faults.find(key); at != std::string::npos; at = faults.find(key, at + 1))
    if (at == 0 || faults[at - 1] == ',') return std::atof(faults.c_str() + at + key.size());
  return 0;
}

// setenv() keeps every value it replaces (callers may still hold them), so
// a new value each epoch would grow the heap by itself. Each variable gets
// one buffer of its own instead, handed to putenv() once and rewritten.
void setVariable(const std::string& name, const std::string& value) {
  static std::map<std::string, std::vector<char>> buffers;
  auto& buffer = buffers[name];
  const std::string entry = name + "=" + value;
  const bool fresh = buffer.empty();
  if (fresh) buffer.resize(1024);
  if (entry.size() >= buffer.size()) std::abort();
  std::memcpy(buffer.data(), entry.c_str(), entry.size() + 1);
  if (fresh) ::putenv(buffer.data());
}

// One stream per call in some epochs: the calls run on a braid thread.
bool epochUsesStream(const Options& o, int epoch) {
  if (o.streams != 1) return o.streams == 2;
  return Dice(o.seed * 31 + static_cast<uint64_t>(epoch)).below(4) == 0;
}

}  // namespace soak
