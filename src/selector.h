// Chooses the algorithm of every call: the one BRAID_ALGO forces for its
// collective, else the one the cost model predicts fastest for this call's
// size, world size and link. Every rank holds the same link model (rank 0's
// measurement, shared at init), so every rank chooses the same algorithm.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "src/common/env.h"
#include "src/common/status.h"

namespace braid {

class Selector {
 public:
  Selector() = default;
  Selector(std::map<std::string, std::string> forced, algo::LinkModel link)
      : forced_(std::move(forced)), link_(link) {}

  // BRAID_ALGO's names must exist: collective and algorithm both.
  static Status validate(const std::map<std::string, std::string>& forced);

  const algo::Algorithm& choose(const algo::CollectiveArgs& args) const;
  // What is worth timing for `args` (BRAID_TUNE): the forced algorithm if
  // any, else every algorithm predicted within kShortlistFactor of the
  // model's choice, in registry order. The rest would only cost calls.
  static constexpr double kShortlistFactor = 2.0;
  std::vector<const algo::Algorithm*> shortlist(const algo::CollectiveArgs& args) const;
  // Whether BRAID_ALGO names the algorithm of `kind`.
  bool forces(algo::CollectiveKind kind) const {
    return forced_.count(std::string(algo::collectiveName(kind))) > 0;
  }
  const algo::LinkModel& link() const { return link_; }

  // For INFO: per collective, which algorithm serves which size range at
  // `nranks` ranks ("allreduce: butterfly < 16 KiB <= ring").
  std::string describe(int nranks, size_t chunkBytes) const;

 private:
  std::map<std::string, std::string> forced_;
  algo::LinkModel link_;
};

// Kinds addressable by BRAID_ALGO, from their names ("allreduce", ...).
bool collectiveFromName(const std::string& name, algo::CollectiveKind* kind);

}  // namespace braid
