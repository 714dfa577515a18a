// SIGUSR1 asks every call in flight to describe itself (with BRAID_DEBUG at
// INFO or TRACE): which collective, which step, which peers it waits for.
// The handler only bumps a counter; each running call notices it on its
// next pass (within the engine's longest sleep, 200 ms) and logs from its
// own thread, so nothing is read while another thread changes it.
#pragma once

#include <cstdint>

namespace braid {

// Installs the handler once, unless the application has its own.
void installStateDumpSignal();
// Bumped by every SIGUSR1; compare to a value seen before.
uint64_t stateDumpRequests();

}  // namespace braid
