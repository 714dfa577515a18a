#include "src/state_dump.h"

#include <signal.h>

#include <atomic>
#include <mutex>

#include "src/common/log.h"

namespace braid {

namespace {
std::atomic<uint64_t> requests{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "used from a signal handler");

void onSignal(int) {
  requests.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

void installStateDumpSignal() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGUSR1, nullptr, &current) != 0) return;
    if (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO)) {
      BRAID_INFO("SIGUSR1 has a handler already; braid will not dump its state on it");
      return;
    }
    struct sigaction mine {};
    mine.sa_handler = onSignal;
    sigemptyset(&mine.sa_mask);
    mine.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &mine, nullptr);
  });
}

uint64_t stateDumpRequests() {
  return requests.load(std::memory_order_relaxed);
}

}  // namespace braid
