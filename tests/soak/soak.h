// Shared declarations of the soak: options, calls, epochs and the coordinator's messages.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../harness/fd_io.h"
#include "braid.h"

namespace soak {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start);

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
// Deterministic choices: every rank derives the same call from (seed, index)
// (calls.cc).

uint64_t mix64(uint64_t x);

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
extern const char* kKindNames[];

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

size_t typeSize(braidDataType_t t);
bool reduces(Kind k);
// Buffers of `count` elements per part, `parts` parts.
size_t partsOf(Kind k, int nranks);
Call makeCall(const Options& o, int64_t index);

// What an epoch's communicator is made with: transport, forced algorithms,
// chunking, single copy, and the faults' seed.
// `rank`: whose environment (-1: the coordinator's summary only).
std::vector<std::pair<std::string, std::string>> epochEnvironment(const Options& o, int epoch,
                                                                  int rank, std::string* summary);
// The probability of `kind` ("drop", "close") in a BRAID_FAULTS value.
double faultRate(const std::string& faults, const std::string& kind);
// Sets an environment variable without growing the heap each epoch.
void setVariable(const std::string& name, const std::string& value);
// One stream per call in some epochs: the calls run on a braid thread.
bool epochUsesStream(const Options& o, int epoch);

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

bool exactHeap();

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

// A rank's life in its process (rank.cc) and the coordinator's (coordinator.cc).
int runRank(const Options& o, int rank, int commandFd, int reportFd, Progress* progress);
int runCoordinator(const Options& o);

}  // namespace soak
