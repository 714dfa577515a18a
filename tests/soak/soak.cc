// Soak with injected faults: N ranks (processes forked by this program) run a
// long, seeded sequence of mixed collectives of random sizes over shared
// memory and TCP, with forced algorithms and BRAID_FAULTS dropping,
// shortening, delaying and cutting messages. It enforces:
//
//   - a call that returns braidSuccess has exactly the right result (the data
//     make every result exact, and each rank computes it locally), left its
//     input alone and wrote nothing past its output;
//   - a call that fails returns an error code that a fault explains
//     (braidRemoteError, braidTimeout; braidInvalidUsage where messages are
//     dropped) with a message, within the timeout and a little; the next
//     call on that communicator fails at once; no call hangs, no rank
//     crashes;
//   - after a failure every rank destroys its communicator and the ranks
//     build a new one and go on;
//   - open fds, threads, resident memory and heap bytes in use are as many
//     at the end as after a warm-up, measured with no communicator alive.
//
// It prints what happened: calls, successes, failures by code (with an
// example message each), where the time went, and the resource figures.
//
// The parent process coordinates and never calls braid: it starts each
// communicator's life ("epoch"), relays rank 0's unique id, runs the calls
// in batches, and decides after each batch, from the ranks' reports,
// whether to go on or rebuild. Every rank derives the same calls, and each
// epoch's configuration, from the seed, so only indices cross the pipes.
//
// Usage: soak [--calls N] [--ranks N] [--seed N] [--faults SPEC]
//             [--timeout SECONDS] [--epoch-calls N] [--batch N]
//             [--max-bytes N] [--limit SECONDS] [--streams never|some|always]
//             [--verbose]
#include <dirent.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "../harness/fd_io.h"
#include "braid.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Options {
  int64_t calls = 100000;
  int ranks = 4;
  uint64_t seed = 1;
  std::string faults = "drop=5e-5,delay=5e-4,close=3e-5,delay_ms=5";
  double timeout = 1.0;       // per call, braidCommSetTimeout
  int64_t epochCalls = 2500;  // a communicator is rebuilt after this many calls anyway
  int64_t batch = 100;        // calls between two reports to the coordinator
  size_t maxBytes = 1 << 20;  // of any buffer of one call
  double limit = 600;         // seconds for the whole run
  bool verbose = false;       // resources after every communicator
  int streams = 1;            // calls on a stream: 0 never, 1 in some epochs, 2 always
};

// ---------------------------------------------------------------------------
// Deterministic choices: every rank derives the same call from (seed, index).

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Dice {
 public:
  explicit Dice(uint64_t seed) : state_(mix64(seed)) {}
  uint64_t bits() { return state_ = mix64(state_); }
  uint64_t below(uint64_t n) { return n ? bits() % n : 0; }
  double uniform() { return static_cast<double>(bits() >> 11) * 0x1p-53; }

 private:
  uint64_t state_;
};

enum class Kind {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter,
  kSendRecv,
  kBarrier,
  kCount
};
const char* kKindNames[] = {"AllReduce", "Broadcast", "Reduce",  "AllGather", "ReduceScatter",
                            "AllToAll",  "Gather",    "Scatter", "SendRecv",  "Barrier"};
// Percent of calls of each kind.
const int kKindWeights[] = {24, 12, 10, 12, 12, 10, 3, 3, 9, 5};

struct Call {
  int64_t index = 0;
  Kind kind = Kind::kAllReduce;
  braidDataType_t dtype = braidFloat32;
  braidRedOp_t op = braidSum;
  int root = 0;
  int shift = 1;     // SendRecv: rank r sends to r + shift
  size_t count = 0;  // per rank part where the collective has parts
  bool inPlace = false;
};

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

// ---------------------------------------------------------------------------
// Data that make every result exact: small integers, whose sums, products,
// maxima and averages over a few ranks every datatype holds exactly.

uint32_t hash32(uint32_t x) {
  x *= 0x9e3779b1u;
  x ^= x >> 15;
  x *= 0x85ebca77u;
  x ^= x >> 13;
  return x;
}

// Every partial result stays at most 127: exact in bf16 (8 significant
// bits; fp16 and bf16 round each partial result) and no overflow in int8.
struct Values {
  uint32_t key;
  braidRedOp_t op;
  uint32_t nranks;
  // The value of element i.
  uint32_t operator()(size_t i) const {
    const uint32_t h = hash32(static_cast<uint32_t>(i) * 0x27d4eb2fu ^ key);
    switch (op) {
      case braidProd:
        return nranks <= 6 ? 1 + (h >> 31) : 1;  // 1 or 2
      case braidMax:
      case braidMin:
        return h % 101;
      case braidAvg:
        // Multiples of nranks: the average is a whole number in any type.
        return nranks * (h % (127 / nranks / nranks + 1));
      default:
        return h % (127 / nranks + 1);
    }
  }
};

Values valuesOf(const Call& c, int rank, int nranks) {
  return {static_cast<uint32_t>(mix64(static_cast<uint64_t>(c.index) * 131 + rank)), c.op,
          static_cast<uint32_t>(nranks)};
}

uint16_t halfBits(float f) {  // exact for the values used here (0 or normal)
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7fffffff) == 0) return static_cast<uint16_t>(b >> 16);
  const uint32_t sign = b >> 31, exponent = ((b >> 23) & 0xff) - 127 + 15,
                 mantissa = (b >> 13) & 0x3ff;
  return static_cast<uint16_t>(sign << 15 | exponent << 10 | mantissa);
}

// Element i of a buffer of type T holding the value v.
template <typename T>
T encode(double v) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<int64_t>(v));  // wraps, as braid's integers do
  } else {
    return static_cast<T>(v);
  }
}
uint16_t encodeHalf(double v) {
  return halfBits(static_cast<float>(v));
}
uint16_t encodeBfloat16(double v) {
  const float f = static_cast<float>(v);
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>(b >> 16);
}

template <typename T, typename Encode, typename Value>
void storeEach(void* buffer, size_t offset, size_t n, Encode encode, Value value) {
  T* p = static_cast<T*>(buffer) + offset;
  for (size_t i = 0; i < n; ++i) p[i] = encode(value(i));
}

// Writes value(i) as elements offset + i, i < n, of a buffer of type t.
template <typename Value>
void storeAll(void* buffer, size_t offset, size_t n, braidDataType_t t, Value value) {
  switch (t) {
    case braidInt8:
      return storeEach<int8_t>(buffer, offset, n, encode<int8_t>, value);
    case braidUint8:
      return storeEach<uint8_t>(buffer, offset, n, encode<uint8_t>, value);
    case braidInt32:
      return storeEach<int32_t>(buffer, offset, n, encode<int32_t>, value);
    case braidUint32:
      return storeEach<uint32_t>(buffer, offset, n, encode<uint32_t>, value);
    case braidInt64:
      return storeEach<int64_t>(buffer, offset, n, encode<int64_t>, value);
    case braidUint64:
      return storeEach<uint64_t>(buffer, offset, n, encode<uint64_t>, value);
    case braidFloat16:
      return storeEach<uint16_t>(buffer, offset, n, encodeHalf, value);
    case braidBfloat16:
      return storeEach<uint16_t>(buffer, offset, n, encodeBfloat16, value);
    case braidFloat32:
      return storeEach<float>(buffer, offset, n, encode<float>, value);
    default:
      return storeEach<double>(buffer, offset, n, encode<double>, value);
  }
}

void fill(void* buffer, size_t offset, size_t n, braidDataType_t t, const Values& v,
          size_t firstIndex) {
  storeAll(buffer, offset, n, t, [&](size_t i) { return static_cast<double>(v(firstIndex + i)); });
}

// op over ranks of element `i` of every rank's values.
double reduceAt(const Call& c, const std::vector<Values>& all, size_t i) {
  double r = all[0](i);
  for (size_t q = 1; q < all.size(); ++q) {
    const double v = all[q](i);
    switch (c.op) {
      case braidProd:
        r *= v;
        break;
      case braidMax:
        r = std::max(r, v);
        break;
      case braidMin:
        r = std::min(r, v);
        break;
      default:
        r += v;
    }
  }
  if (c.op == braidAvg) r /= static_cast<double>(all.size());
  return r;
}

// Exact memory figures need two malloc settings, which only take effect at
// exec: one arena (braid's threads, streams and init helpers, would each
// keep the free top of an arena of their own resident, which malloc_trim
// does not hand back, and RSS would grow with no byte in use), and no
// per-thread cache (whose freed chunks count as in use), so that the heap
// in use is every byte allocated and not freed.
constexpr char kMallocTunables[] = "glibc.malloc.arena_max=1:glibc.malloc.tcache_count=0";

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

bool exactHeap() {
  const char* t = std::getenv("GLIBC_TUNABLES");
  return t && std::strcmp(t, kMallocTunables) == 0;
}

// ---------------------------------------------------------------------------
// The coordinator's messages.

enum class Command : int32_t { kEpoch, kId, kBatch, kEndEpoch, kDone };
struct CommandMessage {
  Command command;
  int32_t epoch;
  int64_t first, end;  // kBatch: the calls [first, end); kEpoch: first
  char id[BRAID_UNIQUE_ID_BYTES];
};

enum class ReportKind : int32_t { kId, kInit, kBatch, kEpochDone, kStats };
struct Report {
  ReportKind kind;
  int32_t rank;
  int32_t code;      // braidResult_t of init or of the failed call; 0 = none
  int64_t failedAt;  // kBatch: index of the failed call, -1 = none
  double seconds;    // kBatch: of the failed call
  char id[BRAID_UNIQUE_ID_BYTES];
  char message[768];
  // kEpochDone: resources with no communicator alive
  int64_t fds, threads, rssKiB, anonKiB;
  int64_t heapBytes;  // allocated and not freed (one arena: all of them)
};

struct Stats {
  int64_t calls = 0, successes = 0, wrong = 0, badFailures = 0, skipped = 0;
  int64_t failuresByCode[16] = {};
  int64_t bytesChecked = 0;
  double callSeconds = 0, failedSeconds = 0, checkSeconds = 0, initSeconds = 0, destroySeconds = 0,
         maxFailedCallSeconds = 0;
  int64_t callsByKind[static_cast<int>(Kind::kCount)] = {};
  char firstWrong[512] = {};
  char firstBad[512] = {};
};

// A rank's position, readable by the coordinator when something hangs.
struct Progress {
  std::atomic<int64_t> call{-1};
  std::atomic<int32_t> epoch{-1};
  char what[96];
};

using braid::test::readAll;
using braid::test::writeAll;

int64_t countEntries(const char* dir) {
  DIR* d = ::opendir(dir);
  if (!d) return -1;
  int64_t n = 0;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

int64_t statusKiB(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t v = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') v = std::atoll(line + n + 1);
  std::fclose(f);
  return v;
}

// ---------------------------------------------------------------------------
// A rank.

class Rank {
  // What one call in flight needs; two on two streams.
  struct Slot {
    std::vector<uint8_t> send, recv, expected;
    size_t sendElements = 0;  // of send, filled by prepare() and never to change
    braidStream_t stream = nullptr;
  };

 public:
  Rank(const Options& o, int rank, int commandFd, int reportFd, Progress* progress)
      : o_(o), rank_(rank), in_(commandFd), out_(reportFd), progress_(progress) {
    const size_t bytes = o.maxBytes + 64;
    for (Slot& slot : slots_) {
      slot.send.assign(bytes, 0);
      slot.recv.assign(bytes, 0);
      slot.expected.assign(bytes, 0);
    }
  }

  int run() {
    CommandMessage m;
    while (readAll(in_, &m, sizeof m)) {
      switch (m.command) {
        case Command::kEpoch:
          startEpoch(m);
          break;
        case Command::kBatch:
          runBatch(m.first, m.end);
          break;
        case Command::kEndEpoch:
          endEpoch();
          break;
        case Command::kDone: {
#ifdef __SANITIZE_ADDRESS__
          // Ranks end with _Exit, past LeakSanitizer's exit hook: every
          // communicator is gone by now, so anything still allocated by
          // braid is a leak.
          if (__lsan_do_recoverable_leak_check() != 0) ++stats_.badFailures;
#endif
          Report r = report(ReportKind::kStats);
          writeAll(out_, &r, sizeof r);
          writeAll(out_, &stats_, sizeof stats_);
          return 0;
        }
        case Command::kId:
          break;
      }
    }
    return 1;  // the coordinator went away
  }

 private:
  Report report(ReportKind kind) {
    Report r{};
    r.kind = kind;
    r.rank = rank_;
    r.failedAt = -1;
    return r;
  }

  void startEpoch(const CommandMessage& m) {
    progress_->epoch = m.epoch;
    std::string summary;
    for (const auto& [k, v] : epochEnvironment(o_, m.epoch, rank_, &summary)) setVariable(k, v);
    useStream_ = epochUsesStream(o_, m.epoch);
    braidUniqueId id{};
    if (rank_ == 0) {
      Report r = report(ReportKind::kId);
      r.code = braidGetUniqueId(&id);
      std::snprintf(r.message, sizeof r.message, "%s", braidGetLastError(nullptr));
      std::memcpy(r.id, id.internal, sizeof r.id);
      // On failure the zero id fails init at once, on every rank.
      writeAll(out_, &r, sizeof r);
    } else {
      CommandMessage idMessage;
      if (!readAll(in_, &idMessage, sizeof idMessage)) std::_Exit(1);
      std::memcpy(id.internal, idMessage.id, sizeof id.internal);
    }
    const auto start = Clock::now();
    Report r = report(ReportKind::kInit);
    r.code = braidCommInitRank(&comm_, o_.ranks, id, rank_);
    if (r.code == braidSuccess) r.code = braidCommSetTimeout(comm_, o_.timeout);
    // Two streams: consecutive calls run on them at once, sharing every
    // connection.
    for (Slot& slot : slots_)
      if (r.code == braidSuccess && useStream_) r.code = braidStreamCreate(comm_, &slot.stream);
    std::snprintf(r.message, sizeof r.message, "%s", braidGetLastError(nullptr));
    stats_.initSeconds += secondsSince(start);
    writeAll(out_, &r, sizeof r);
  }

  void destroyCommunicator() {
    for (Slot& slot : slots_) {
      if (slot.stream) braidStreamDestroy(slot.stream);
      slot.stream = nullptr;
    }
    if (comm_) braidCommDestroy(comm_);
    comm_ = nullptr;
  }

  void endEpoch() {
    const auto start = Clock::now();
    destroyCommunicator();
    stats_.destroySeconds += secondsSince(start);
    Report r = report(ReportKind::kEpochDone);
    // Free memory the allocator keeps is not held by anyone: hand it back
    // first, so that what remains is what is in use.
    ::malloc_trim(0);
    r.fds = countEntries("/proc/self/fd");
    r.threads = countEntries("/proc/self/task");
    r.rssKiB = statusKiB("VmRSS");
    r.anonKiB = statusKiB("RssAnon");
    const struct mallinfo2 heap = ::mallinfo2();
    r.heapBytes = static_cast<int64_t>(heap.uordblks + heap.hblkhd);
    writeAll(out_, &r, sizeof r);
  }

  void runBatch(int64_t first, int64_t end) {
    Report r = report(ReportKind::kBatch);
    // On streams two calls at a time, one per stream; else one.
    const int64_t step = slots_[0].stream ? 2 : 1;
    for (int64_t i = first; i < end && comm_; i += step) {
      const int n = static_cast<int>(std::min(step, end - i));
      Call calls[2];
      braidResult_t results[2] = {braidSuccess, braidSuccess};
      std::string whys[2];
      progress_->call = i;
      const auto start = Clock::now();
      for (int k = 0; k < n; ++k) {
        calls[k] = makeCall(o_, i + k);
        const Call& c = calls[k];
        std::snprintf(progress_->what, sizeof progress_->what, "%s count %zu type %d op %d root %d",
                      kKindNames[static_cast<int>(c.kind)], c.count, c.dtype, c.op, c.root);
        prepare(c, slots_[k]);
        results[k] = issue(c, slots_[k]);
        if (results[k] != braidSuccess) whys[k] = braidGetLastError(nullptr);
      }
      for (int k = 0; k < n; ++k)
        if (results[k] == braidSuccess && slots_[k].stream) {
          results[k] = braidStreamSynchronize(slots_[k].stream);
          if (results[k] != braidSuccess) whys[k] = braidGetLastError(nullptr);
        }
      const double seconds = secondsSince(start);
      int64_t failedAt = -1;
      for (int k = 0; k < n; ++k) {
        const Call& c = calls[k];
        ++stats_.calls;
        ++stats_.callsByKind[static_cast<int>(c.kind)];
        if (results[k] == braidSuccess) {
          ++stats_.successes;
          stats_.callSeconds += seconds / n;
          const auto checkStart = Clock::now();
          check(c, slots_[k]);
          stats_.checkSeconds += secondsSince(checkStart);
          continue;
        }
        noteFailure(c, results[k], whys[k], seconds);
        if (failedAt < 0) {
          failedAt = i + k;
          r.code = results[k];
          r.failedAt = failedAt;
          r.seconds = seconds;
          std::snprintf(r.message, sizeof r.message, "%s", whys[k].c_str());
        }
      }
      if (failedAt < 0) continue;
      // A failed call leaves the communicator unusable on this rank: the
      // next call fails too, at once, instead of waiting for peers that
      // gave up or returning what they did not send.
      const auto againStart = Clock::now();
      const braidResult_t again = braidBarrier(comm_, nullptr);
      const double againSeconds = secondsSince(againStart);
      if (again == braidSuccess || againSeconds > 2) {
        if (stats_.badFailures++ == 0)
          std::snprintf(stats_.firstBad, sizeof stats_.firstBad,
                        "after call #%lld failed (%d: %.300s), the next call on the communicator "
                        "returned %d after %.2f s",
                        static_cast<long long>(failedAt), r.code, r.message, again, againSeconds);
      }
      // The communicator is done for; the coordinator decides when every
      // rank builds the next.
      destroyCommunicator();
      stats_.skipped += end - i - n;
      break;
    }
    writeAll(out_, &r, sizeof r);
  }

  void noteFailure(const Call& c, braidResult_t result, const std::string& why, double seconds) {
    ++stats_.failuresByCode[result & 15];
    stats_.failedSeconds += seconds;
    stats_.maxFailedCallSeconds = std::max(stats_.maxFailedCallSeconds, seconds);
    // A dropped message looks to its receiver like a peer that moved on
    // (braidInvalidUsage); a cut or a peer that gave up is a remote error;
    // a message that never comes, or comes late, a timeout. Nothing else.
    const bool allowed = result == braidRemoteError || result == braidTimeout ||
                         (result == braidInvalidUsage && mayDrop_);
    const bool late = seconds > o_.timeout + 5;
    if ((!allowed || why.empty() || late) && stats_.badFailures++ == 0)
      std::snprintf(stats_.firstBad, sizeof stats_.firstBad,
                    "call #%lld %s failed with %d after %.2f s: %s",
                    static_cast<long long>(c.index), kKindNames[static_cast<int>(c.kind)], result,
                    seconds, why.empty() ? "(no message)" : why.c_str());
  }

  // Fills this rank's inputs and poisons its outputs.
  void prepare(const Call& c, Slot& slot) {
    const size_t es = typeSize(c.dtype), n = static_cast<size_t>(o_.ranks);
    const size_t parts = partsOf(c.kind, o_.ranks);
    std::memset(slot.recv.data(), 0xa5, std::min(slot.recv.size(), c.count * parts * es + 64));
    const Values mine = valuesOf(c, rank_, o_.ranks);
    // Inputs a call must leave as they are (out of place only).
    slot.sendElements = 0;
    if (!c.inPlace && c.kind != Kind::kBarrier)
      slot.sendElements = c.kind == Kind::kReduceScatter || c.kind == Kind::kAllToAll ||
                                  (c.kind == Kind::kScatter && rank_ == c.root)
                              ? n * c.count
                          : c.kind == Kind::kScatter ? 0
                                                     : c.count;
    switch (c.kind) {
      case Kind::kAllGather:
        if (c.inPlace)
          fill(slot.recv.data(), rank_ * c.count, c.count, c.dtype, mine, 0);
        else
          fill(slot.send.data(), 0, c.count, c.dtype, mine, 0);
        break;
      case Kind::kReduceScatter:
        fill(slot.send.data(), 0, n * c.count, c.dtype, mine, 0);
        break;
      case Kind::kGather:
        if (c.inPlace && rank_ == c.root)
          fill(slot.recv.data(), rank_ * c.count, c.count, c.dtype, mine, 0);
        else
          fill(slot.send.data(), 0, c.count, c.dtype, mine, 0);
        break;
      case Kind::kScatter:
        if (rank_ == c.root) fill(slot.send.data(), 0, n * c.count, c.dtype, mine, 0);
        break;
      case Kind::kAllToAll:
        fill(slot.send.data(), 0, n * c.count, c.dtype, mine, 0);
        break;
      case Kind::kBarrier:
        break;
      default:
        if (c.inPlace)
          fill(slot.recv.data(), 0, c.count, c.dtype, mine, 0);
        else
          fill(slot.send.data(), 0, c.count, c.dtype, mine, 0);
    }
  }

  braidResult_t issue(const Call& c, Slot& slot) {
    const size_t es = typeSize(c.dtype);
    uint8_t* send = slot.send.data();
    uint8_t* recv = slot.recv.data();
    const void* in = c.inPlace ? recv : send;
    braidStream_t s = slot.stream;
    braidResult_t r = braidSuccess;
    switch (c.kind) {
      case Kind::kAllReduce:
        r = braidAllReduce(in, recv, c.count, c.dtype, c.op, comm_, s);
        break;
      case Kind::kBroadcast:
        r = braidBroadcast(in, recv, c.count, c.dtype, c.root, comm_, s);
        break;
      case Kind::kReduce:
        r = braidReduce(in, recv, c.count, c.dtype, c.op, c.root, comm_, s);
        break;
      case Kind::kAllGather:
        r = braidAllGather(c.inPlace ? recv + rank_ * c.count * es : send, recv, c.count, c.dtype,
                           comm_, s);
        break;
      case Kind::kReduceScatter:
        r = braidReduceScatter(send, c.inPlace ? send + rank_ * c.count * es : recv, c.count,
                               c.dtype, c.op, comm_, s);
        break;
      case Kind::kAllToAll:
        r = braidAllToAll(send, recv, c.count, c.dtype, comm_, s);
        break;
      case Kind::kGather:
        r = braidGather(c.inPlace && rank_ == c.root ? recv + rank_ * c.count * es : send, recv,
                        c.count, c.dtype, c.root, comm_, s);
        break;
      case Kind::kScatter:
        r = braidScatter(send, c.inPlace && rank_ == c.root ? send + rank_ * c.count * es : recv,
                         c.count, c.dtype, c.root, comm_, s);
        break;
      case Kind::kSendRecv: {
        const int to = (rank_ + c.shift) % o_.ranks;
        const int from = (rank_ - c.shift + o_.ranks) % o_.ranks;
        braidGroupStart();
        braidSend(send, c.count, c.dtype, to, comm_, s);
        braidRecv(recv, c.count, c.dtype, from, comm_, s);
        r = braidGroupEnd();
        break;
      }
      case Kind::kBarrier:
        r = braidBarrier(comm_, s);
        break;
      case Kind::kCount:
        break;
    }
    return r;
  }

  void wrongResult(const Call& c, const char* what, size_t at, size_t bytes, uint8_t got,
                   uint8_t expected) {
    ++stats_.wrong;
    if (stats_.firstWrong[0] == 0)
      std::snprintf(stats_.firstWrong, sizeof stats_.firstWrong,
                    "rank %d: call #%lld %s (count %zu, type %d, op %d, root %d, in place %d, "
                    "epoch %d) returned braidSuccess with %s: byte %zu of %zu is 0x%02x, "
                    "expected 0x%02x",
                    rank_, static_cast<long long>(c.index), kKindNames[static_cast<int>(c.kind)],
                    c.count, c.dtype, c.op, c.root, c.inPlace ? 1 : 0, progress_->epoch.load(),
                    what, at, bytes, got, expected);
  }

  // Compares `bytes` at `got` with slot.expected; false (and a report) if they differ.
  bool same(const Call& c, const char* what, const uint8_t* got, size_t bytes, Slot& slot) {
    if (std::memcmp(got, slot.expected.data(), bytes) == 0) return true;
    size_t at = 0;
    while (at < bytes && got[at] == slot.expected[at]) ++at;
    wrongResult(c, what, at, bytes, got[at], slot.expected[at]);
    return false;
  }

  // Compares this rank's output with what it must be, and its input with
  // what it was.
  void check(const Call& c, Slot& slot) {
    const size_t es = typeSize(c.dtype), n = static_cast<size_t>(o_.ranks);
    if (slot.sendElements > 0) {
      fill(slot.expected.data(), 0, slot.sendElements, c.dtype, valuesOf(c, rank_, o_.ranks), 0);
      if (!same(c, "its send buffer changed", slot.send.data(), slot.sendElements * es, slot))
        return;
    }
    std::vector<Values> all;
    for (int q = 0; q < o_.ranks; ++q) all.push_back(valuesOf(c, q, o_.ranks));
    const uint8_t* got = slot.recv.data();
    size_t elements = 0;
    switch (c.kind) {
      case Kind::kAllReduce:
        storeAll(slot.expected.data(), 0, c.count, c.dtype,
                 [&](size_t i) { return reduceAt(c, all, i); });
        elements = c.count;
        break;
      case Kind::kReduce:
        if (rank_ != c.root) return;
        storeAll(slot.expected.data(), 0, c.count, c.dtype,
                 [&](size_t i) { return reduceAt(c, all, i); });
        elements = c.count;
        break;
      case Kind::kReduceScatter:
        storeAll(slot.expected.data(), 0, c.count, c.dtype,
                 [&](size_t i) { return reduceAt(c, all, rank_ * c.count + i); });
        if (c.inPlace) got = slot.send.data() + rank_ * c.count * es;
        elements = c.count;
        break;
      case Kind::kBroadcast:
        fill(slot.expected.data(), 0, c.count, c.dtype, all[c.root], 0);
        elements = c.count;
        break;
      case Kind::kAllGather:
        for (size_t q = 0; q < n; ++q)
          fill(slot.expected.data(), q * c.count, c.count, c.dtype, all[q], 0);
        elements = n * c.count;
        break;
      case Kind::kGather:
        if (rank_ != c.root) return;
        for (size_t q = 0; q < n; ++q)
          fill(slot.expected.data(), q * c.count, c.count, c.dtype, all[q], 0);
        elements = n * c.count;
        break;
      case Kind::kScatter:
        fill(slot.expected.data(), 0, c.count, c.dtype, all[c.root], rank_ * c.count);
        if (c.inPlace && rank_ == c.root) got = slot.send.data() + rank_ * c.count * es;
        elements = c.count;
        break;
      case Kind::kAllToAll:
        for (size_t q = 0; q < n; ++q)
          fill(slot.expected.data(), q * c.count, c.count, c.dtype, all[q], rank_ * c.count);
        elements = n * c.count;
        break;
      case Kind::kSendRecv:
        fill(slot.expected.data(), 0, c.count, c.dtype,
             all[(rank_ - c.shift + o_.ranks) % o_.ranks], 0);
        elements = c.count;
        break;
      default:
        return;
    }
    const size_t bytes = elements * es;
    stats_.bytesChecked += static_cast<int64_t>(bytes);
    if (!same(c, "a wrong result", got, bytes, slot) || got != slot.recv.data()) return;
    // Nothing written past the result.
    for (size_t at = bytes; at < bytes + 64; ++at)
      if (slot.recv[at] != 0xa5)
        return wrongResult(c, "bytes written past the result", at, bytes, slot.recv[at], 0xa5);
  }

  const Options& o_;
  const int rank_;
  const bool mayDrop_ = faultRate(o_.faults, "drop") > 0;
  const int in_, out_;
  Progress* progress_;
  braidComm_t comm_ = nullptr;
  bool useStream_ = false;
  Slot slots_[2];
  Stats stats_;
};

// ---------------------------------------------------------------------------
// The coordinator.

class Coordinator {
 public:
  explicit Coordinator(const Options& o) : o_(o) {}

  int run() {
    signal(SIGPIPE, SIG_IGN);
    progress_ =
        static_cast<Progress*>(::mmap(nullptr, sizeof(Progress) * o_.ranks, PROT_READ | PROT_WRITE,
                                      MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (progress_ == MAP_FAILED) return fatal("mmap failed");
    for (int r = 0; r < o_.ranks; ++r) new (&progress_[r]) Progress;
    for (int r = 0; r < o_.ranks; ++r) {
      int command[2], reports[2];
      if (::pipe2(command, O_CLOEXEC) != 0 || ::pipe2(reports, O_CLOEXEC) != 0)
        return fatal("pipe failed");
      std::fflush(stdout);
      std::fflush(stderr);
      const pid_t pid = ::fork();
      if (pid < 0) return fatal("fork failed");
      if (pid == 0) {
        ::close(command[1]);
        ::close(reports[0]);
        for (int q = 0; q < r; ++q) {
          ::close(toRank_[q]);
          ::close(fromRank_[q]);
        }
        Rank rank(o_, r, command[0], reports[1], &progress_[r]);
        std::_Exit(rank.run());
      }
      ::close(command[0]);
      ::close(reports[1]);
      pids_.push_back(pid);
      toRank_.push_back(command[1]);
      fromRank_.push_back(reports[0]);
    }
    start_ = Clock::now();
    const int status = coordinate();
    stopRanks(status != 0);
    return status;
  }

 private:
  int fatal(const std::string& why) {
    std::fprintf(stderr, "soak: %s\n", why.c_str());
    return 1;
  }

  bool sendAll(const CommandMessage& m) {
    for (int fd : toRank_)
      if (!writeAll(fd, &m, sizeof m)) return false;
    return true;
  }

  // One report from `rank`, or false (and a message) when it died or hung.
  bool receive(int rank, Report* r, double limitSeconds) {
    pollfd p{fromRank_[rank], POLLIN, 0};
    const auto until = Clock::now() + std::chrono::duration<double>(limitSeconds);
    while (true) {
      const double left = std::chrono::duration<double>(until - Clock::now()).count();
      if (left <= 0) {
        std::fprintf(stderr,
                     "soak: FAIL: rank %d did not report within %.0f s (hung?): epoch %d, call "
                     "#%lld: %s\n",
                     rank, limitSeconds, progress_[rank].epoch.load(),
                     static_cast<long long>(progress_[rank].call.load()), progress_[rank].what);
        return false;
      }
      const int ready = ::poll(&p, 1, static_cast<int>(std::min(left * 1000 + 1, 1000.0)));
      if (ready < 0 && errno != EINTR) return false;
      if (ready > 0) break;
    }
    if (readAll(fromRank_[rank], r, sizeof *r)) return true;
    std::fprintf(stderr, "soak: FAIL: rank %d died (%s) in epoch %d at call #%lld: %s\n", rank,
                 describeExit(rank).c_str(), progress_[rank].epoch.load(),
                 static_cast<long long>(progress_[rank].call.load()), progress_[rank].what);
    return false;
  }

  std::string describeExit(int rank) {
    int status = 0;
    for (int i = 0; i < 50; ++i) {
      if (::waitpid(pids_[rank], &status, WNOHANG) == pids_[rank]) {
        pids_[rank] = -1;
        if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
        return "exit " + std::to_string(WEXITSTATUS(status));
      }
      usleep(20000);
    }
    return "still running";
  }

  // Seconds a batch may take at most: every call at its timeout, plus slack
  // for a loaded machine. Beyond it a rank hangs.
  double batchLimit() const { return 30 + 3 * o_.timeout; }

  int coordinate() {
    int64_t next = 0;
    int epoch = 0, initFailuresInARow = 0;
    bool warm = false;
    while (next < o_.calls) {
      if (secondsSince(start_) > o_.limit)
        return fatal("FAIL: over the time limit of " + std::to_string(o_.limit) + " s");
      const int64_t epochEnd = std::min(o_.calls, next + o_.epochCalls);
      std::string config;
      epochEnvironment(o_, epoch, -1, &config);
      CommandMessage m{};
      m.command = Command::kEpoch;
      m.epoch = epoch;
      m.first = next;
      if (!sendAll(m)) return fatal("a rank went away");
      Report r;
      if (!receive(0, &r, 60)) return 1;
      bool initOk = r.code == braidSuccess;
      if (!initOk)
        std::fprintf(stderr, "soak: epoch %d: braidGetUniqueId failed: %s\n", epoch, r.message);
      CommandMessage id{};
      id.command = Command::kId;
      std::memcpy(id.id, r.id, sizeof id.id);
      for (int q = 1; q < o_.ranks; ++q)
        if (!writeAll(toRank_[q], &id, sizeof id)) return fatal("a rank went away");
      for (int q = 0; q < o_.ranks; ++q) {
        if (!receive(q, &r, 60)) return 1;
        if (r.code != braidSuccess) {
          initOk = false;
          ++initFailures_;
          std::fprintf(stderr, "soak: epoch %d: rank %d: init failed (%d): %s\n", epoch, q, r.code,
                       r.message);
        }
      }
      if (initOk) {
        initFailuresInARow = 0;
        while (next < epochEnd) {
          m.command = Command::kBatch;
          m.first = next;
          m.end = std::min(epochEnd, next + o_.batch);
          if (!sendAll(m)) return fatal("a rank went away");
          int64_t failedAt = -1;
          for (int q = 0; q < o_.ranks; ++q) {
            if (!receive(q, &r, batchLimit())) return 1;
            if (r.failedAt < 0) continue;
            if (failedAt < 0 || r.failedAt < failedAt) failedAt = r.failedAt;
            noteFailure(epoch, q, r);
          }
          if (failedAt >= 0) {
            ++rebuildsAfterFailure_;
            next = failedAt + 1;
            break;
          }
          next = m.end;
        }
      } else if (++initFailuresInARow > 3) {
        return fatal("FAIL: init failed in 4 epochs in a row");
      }
      m.command = Command::kEndEpoch;
      if (!sendAll(m)) return fatal("a rank went away");
      for (int q = 0; q < o_.ranks; ++q) {
        if (!receive(q, &r, 60)) return 1;
        resources_[q].end = r;
        if (!warm) resources_[q].warm = r;
        if (o_.verbose)
          std::printf(
              "soak: epoch %d (%s%s) ends at call %lld: rank %d fds %lld threads %lld "
              "RSS %.1f MiB (anonymous %.1f), heap in use %lld bytes\n",
              epoch, config.c_str(), epochUsesStream(o_, epoch) ? "stream" : "",
              static_cast<long long>(next), q, static_cast<long long>(r.fds),
              static_cast<long long>(r.threads), r.rssKiB / 1024.0, r.anonKiB / 1024.0,
              static_cast<long long>(r.heapBytes));
      }
      // The first communicators warm up allocators and caches.
      if (!warm && next >= o_.calls / 10) {
        warm = true;
        warmCalls_ = next;
      }
      ++epoch;
    }
    epochs_ = epoch;
    return summarize();
  }

  void noteFailure(int epoch, int rank, const Report& r) {
    auto& example = examples_[r.code];
    if (example.empty())
      example = "epoch " + std::to_string(epoch) + ", rank " + std::to_string(rank) + ", call #" +
                std::to_string(r.failedAt) + ": " + r.message;
  }

  int summarize() {
    const double seconds = secondsSince(start_);
    CommandMessage m{};
    m.command = Command::kDone;
    if (!sendAll(m)) return fatal("a rank went away");
    Stats total;
    int failures = 0;
    std::vector<Stats> perRank(o_.ranks);
    for (int q = 0; q < o_.ranks; ++q) {
      Report r;
      if (!receive(q, &r, 60)) return 1;
      if (!readAll(fromRank_[q], &perRank[q], sizeof(Stats))) return fatal("no stats");
      const Stats& s = perRank[q];
      total.calls += s.calls;
      total.successes += s.successes;
      total.wrong += s.wrong;
      total.badFailures += s.badFailures;
      total.skipped += s.skipped;
      total.bytesChecked += s.bytesChecked;
      for (int c = 0; c < 16; ++c) total.failuresByCode[c] += s.failuresByCode[c];
      for (int k = 0; k < static_cast<int>(Kind::kCount); ++k)
        total.callsByKind[k] += s.callsByKind[k];
      total.callSeconds += s.callSeconds;
      total.failedSeconds += s.failedSeconds;
      total.checkSeconds += s.checkSeconds;
      total.initSeconds += s.initSeconds;
      total.destroySeconds += s.destroySeconds;
      total.maxFailedCallSeconds = std::max(total.maxFailedCallSeconds, s.maxFailedCallSeconds);
      if (s.wrong) {
        std::fprintf(stderr, "soak: FAIL: %s (%lld wrong results on rank %d)\n", s.firstWrong,
                     static_cast<long long>(s.wrong), q);
        ++failures;
      }
      if (s.badFailures) {
        std::fprintf(stderr,
                     "soak: FAIL: rank %d: %lld failures with a code no fault explains, no "
                     "message, or past the timeout; the first: %s\n",
                     q, static_cast<long long>(s.badFailures), s.firstBad);
        ++failures;
      }
    }
    const double n = o_.ranks;
    std::printf("soak: %d ranks, seed %llu, faults %s, call timeout %.2f s\n", o_.ranks,
                static_cast<unsigned long long>(o_.seed),
                o_.faults.empty() ? "none" : o_.faults.c_str(), o_.timeout);
    std::printf(
        "soak: %lld collectives (%lld calls on all ranks): %lld succeeded, %lld failed, "
        "%lld skipped after a failure in their batch; %.1f MiB of results checked\n",
        static_cast<long long>(total.calls / o_.ranks), static_cast<long long>(total.calls),
        static_cast<long long>(total.successes),
        static_cast<long long>(total.calls - total.successes),
        static_cast<long long>(total.skipped), total.bytesChecked / 1048576.0);
    std::string kinds;
    for (int k = 0; k < static_cast<int>(Kind::kCount); ++k)
      kinds += std::string(k ? ", " : "") + kKindNames[k] + " " +
               std::to_string(total.callsByKind[k] / o_.ranks);
    std::printf("soak: by kind: %s\n", kinds.c_str());
    std::string codes;
    for (int c = 1; c < 16; ++c)
      if (total.failuresByCode[c])
        codes += std::string(codes.empty() ? "" : ", ") +
                 braidGetErrorString(static_cast<braidResult_t>(c)) + " " +
                 std::to_string(total.failuresByCode[c]);
    std::printf("soak: failed calls by code: %s\n", codes.empty() ? "none" : codes.c_str());
    for (const auto& [code, example] : examples_)
      std::printf("soak:   e.g. (%d) %.300s\n", code, example.c_str());
    std::printf(
        "soak: %d communicators (%d rebuilt after a failure, %d inits failed); "
        "wrong results returned as success: %lld\n",
        epochs_, rebuildsAfterFailure_, initFailures_, static_cast<long long>(total.wrong));
    std::printf(
        "soak: %.1f s; per rank: %.1f s in calls that succeeded, %.1f s in calls that "
        "failed (longest %.2f s), %.1f s checking, %.1f s in init, %.1f s in destroy\n",
        seconds, total.callSeconds / n, total.failedSeconds / n, total.maxFailedCallSeconds,
        total.checkSeconds / n, total.initSeconds / n, total.destroySeconds / n);
    // Resources between communicators: after warm-up and at the end.
    for (int q = 0; q < o_.ranks; ++q) {
      const Report& w = resources_[q].warm;
      const Report& e = resources_[q].end;
      std::printf(
          "soak: rank %d with no communicator, after %lld calls -> at the end: fds %lld "
          "-> %lld, threads %lld -> %lld, RSS %.1f -> %.1f MiB (anonymous %.1f -> %.1f), heap "
          "in use %lld -> %lld bytes%s\n",
          q, static_cast<long long>(warmCalls_), static_cast<long long>(w.fds),
          static_cast<long long>(e.fds), static_cast<long long>(w.threads),
          static_cast<long long>(e.threads), w.rssKiB / 1024.0, e.rssKiB / 1024.0,
          w.anonKiB / 1024.0, e.anonKiB / 1024.0, static_cast<long long>(w.heapBytes),
          static_cast<long long>(e.heapBytes), exactHeap() ? "" : " (inexact)");
      if (e.fds > w.fds || e.threads > w.threads) {
        std::fprintf(stderr, "soak: FAIL: rank %d holds more fds or threads at the end\n", q);
        ++failures;
      }
      // Under a sanitizer its allocator keeps freed memory on purpose, and
      // LeakSanitizer checks for leaks instead (see kDone).
      if (kSanitized) continue;
      // A few bytes of slack: chunk sizes of what the allocator itself keeps.
      if (exactHeap() && e.heapBytes > w.heapBytes + 4096) {
        std::fprintf(stderr, "soak: FAIL: rank %d holds %lld more heap bytes at the end\n", q,
                     static_cast<long long>(e.heapBytes - w.heapBytes));
        ++failures;
      }
      // Slack for the allocator's bookkeeping and page rounding.
      const int64_t slack = 1024;
      if (e.rssKiB > w.rssKiB + slack) {
        std::fprintf(stderr, "soak: FAIL: rank %d's RSS grew by %.1f MiB\n", q,
                     (e.rssKiB - w.rssKiB) / 1024.0);
        ++failures;
      }
    }
    if (total.calls / o_.ranks < o_.calls) {
      std::fprintf(stderr, "soak: FAIL: only %lld collectives ran\n",
                   static_cast<long long>(total.calls / o_.ranks));
      ++failures;
    }
    if (faultRate(o_.faults, "drop") + faultRate(o_.faults, "close") > 0 &&
        total.calls == total.successes) {
      std::fprintf(stderr, "soak: FAIL: drops or cuts were injected but no call failed\n");
      ++failures;
    }
    std::printf("soak: %s\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
  }

  void stopRanks(bool kill) {
    for (int fd : toRank_) ::close(fd);
    for (size_t q = 0; q < pids_.size(); ++q) {
      if (pids_[q] < 0) continue;
      if (kill) ::kill(pids_[q], SIGKILL);
      int status = 0;
      ::waitpid(pids_[q], &status, 0);
      if (!kill && (!WIFEXITED(status) || WEXITSTATUS(status) != 0))
        std::fprintf(stderr, "soak: rank %zu exited abnormally (status %d)\n", q, status);
    }
    for (int fd : fromRank_) ::close(fd);
  }

  const Options& o_;
  Progress* progress_ = nullptr;
  std::vector<pid_t> pids_;
  std::vector<int> toRank_, fromRank_;
  Clock::time_point start_;
  struct Resources {
    Report warm{}, end{};
  };
  std::map<int, Resources> resources_;
  std::map<int, std::string> examples_;
  int64_t warmCalls_ = 0;
  int epochs_ = 0, rebuildsAfterFailure_ = 0, initFailures_ = 0;
};

bool parseOptions(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--verbose") {
      o->verbose = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "soak: %s needs a value\n", a.c_str());
      return false;
    }
    const char* v = argv[++i];
    if (a == "--calls") {
      o->calls = std::atoll(v);
    } else if (a == "--ranks") {
      o->ranks = std::atoi(v);
    } else if (a == "--seed") {
      o->seed = std::strtoull(v, nullptr, 10);
    } else if (a == "--faults") {
      o->faults = v;
    } else if (a == "--timeout") {
      o->timeout = std::atof(v);
    } else if (a == "--epoch-calls") {
      o->epochCalls = std::atoll(v);
    } else if (a == "--batch") {
      o->batch = std::atoll(v);
    } else if (a == "--max-bytes") {
      o->maxBytes = static_cast<size_t>(std::atoll(v));
    } else if (a == "--streams") {
      o->streams = std::string(v) == "never" ? 0 : std::string(v) == "always" ? 2 : 1;
    } else if (a == "--limit") {
      o->limit = std::atof(v);
    } else {
      std::fprintf(stderr, "soak: unknown option %s\n", a.c_str());
      return false;
    }
  }
  if (o->ranks < 2 || o->ranks > 8 || o->calls < 1 || o->timeout <= 0 || o->epochCalls < 1 ||
      o->batch < 1 || o->maxBytes < 1024) {
    std::fprintf(stderr, "soak: an option is out of range\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (!exactHeap()) {
    setenv("GLIBC_TUNABLES", kMallocTunables, 1);
    ::execv("/proc/self/exe", argv);  // on failure, go on with inexact figures
  }
  Options o;
  if (!parseOptions(argc, argv, &o)) return 2;
  // Init may take its time on a loaded machine; calls get the short
  // per-communicator timeout.
  setenv("BRAID_TIMEOUT", "30", 1);
  Coordinator coordinator(o);
  return coordinator.run();
}
