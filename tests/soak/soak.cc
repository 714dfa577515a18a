// The soak's command line and main (calls.cc, values.cc, rank.cc, coordinator.cc do the rest).
//
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
#include "soak.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace soak {

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool exactHeap() {
  const char* t = std::getenv("GLIBC_TUNABLES");
  return t && std::strcmp(t, kMallocTunables) == 0;
}

namespace {

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
}  // namespace soak

int main(int argc, char** argv) {
  using namespace soak;
  if (!exactHeap()) {
    setenv("GLIBC_TUNABLES", kMallocTunables, 1);
    ::execv("/proc/self/exe", argv);  // on failure, go on with inexact figures
  }
  Options o;
  if (!parseOptions(argc, argv, &o)) return 2;
  // Init may take its time on a loaded machine; calls get the short
  // per-communicator timeout.
  setenv("BRAID_TIMEOUT", "30", 1);
  return runCoordinator(o);
}
