// The topology tests live in two files (detection, and what is exchanged and
// chosen from it) but build one executable: what both need is defined once
// here, so the two cannot drift apart or collide at link time.
#pragma once

#include <stdlib.h>

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "topology/topology.h"

namespace braid::topo {

// Readable failures: gtest prints descriptions in their encoded form. Inline
// and in one place, so every file of the executable prints them alike.
inline void PrintTo(const RankTopology& r, std::ostream* os) {
  *os << r.encode();
}

// Sets an environment variable for one scope (the tests read configuration
// from the environment, as braid does at init).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// A rank of `host` in NUMA node `numa` (-1: unknown), on cores 0-3 (8-11 on node 1).
inline RankTopology rankOn(const std::string& host, int numa, std::vector<PciDevice> devices = {}) {
  RankTopology r;
  r.hostname = host;
  r.hostId = host + "/boot";
  r.pid = 100;
  r.numaNode = numa;
  r.cores = numa == 1 ? std::vector<int>{8, 9, 10, 11} : std::vector<int>{0, 1, 2, 3};
  r.devices = std::move(devices);
  return r;
}

}  // namespace braid::topo
