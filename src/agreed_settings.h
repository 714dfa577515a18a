// The settings every rank of a communicator must share: each rank derives
// from them, alone, what its peers must do alike (the pieces of a message,
// the algorithm of a call, whether a call runs on the board or as a GPU
// job). Ranks that differ would fail later, mid-call and far from the
// cause, or wait on each other; so each rank publishes its own at
// rendezvous, and init fails on every rank, naming the setting, the ranks
// and their values. Settings a pair negotiates (BRAID_SHM_BYTES) or that
// concern one rank alone (BRAID_TIMEOUT, BRAID_HOSTID) are not among them.
#pragma once

#include <span>
#include <string>

#include "src/common/env.h"
#include "src/common/status.h"

namespace braid {

// The longest line agreedSettings makes (BRAID_ALGO, the longest value,
// names known collectives and algorithms only), as rendezvous bounds it.
inline constexpr size_t kMaxAgreedSettingsBytes = 2048;

// `config`'s shared settings as one line: "NAME=value" entries, as
// docs/ENVIRONMENT.md names them, apart by '\x1f'.
std::string agreedSettings(const Config& config);

// invalidUsage naming the first setting in which some rank's line in
// `published` (by rank) differs from rank 0's; every rank, given the same
// lines, reaches the same verdict.
Status checkAgreedSettings(std::span<const std::string> published);

}  // namespace braid
