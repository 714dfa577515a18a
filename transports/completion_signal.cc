#include "transports/completion_signal.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <new>

namespace braid::transport {
namespace {

// Never destroyed: threads that outlive main's return may still complete
// requests. A forked child makes its own (the parent's descriptor would
// carry wake-ups between the two processes), and so that a lock another
// thread of the parent held at the fork is not inherited held.
struct SignalState {
  // Orders the last sleeper's drain with a new sleeper's start: the count
  // of sleepers (detail::completionSleepers) changes only under it.
  std::mutex mutex;
  int fd = -1;
};

// In static storage, so that a forked child makes its own without the
// allocator, which another thread of the parent may have held at the fork.
alignas(SignalState) unsigned char storage[sizeof(SignalState)];
SignalState* state = nullptr;
std::once_flag made;

void makeState() {
  state = new (storage) SignalState;
  state->fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

void remakeInChild() {
  const int inherited = state->fd;
  makeState();  // over the parent's copy, whose lock may be held for good
  if (inherited >= 0) ::close(inherited);
  detail::completionSleepers.store(0);
}

SignalState& signalState() {
  std::call_once(made, [] {
    makeState();
    (void)pthread_atfork(nullptr, nullptr, remakeInChild);
  });
  return *state;
}

}  // namespace

void CompletionSignal::beginSleep() {
  SignalState& s = signalState();
  {
    std::lock_guard lock(s.mutex);
    detail::completionSleepers.fetch_add(1, std::memory_order_seq_cst);
  }
  // A completion stores its request's state, then loads the count; the
  // sleeper stores the count, then loads its requests' states: with both in
  // one total order, either the completion sees this sleeper or the sleeper
  // sees the completion.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void CompletionSignal::endSleep() {
  SignalState& s = signalState();
  std::lock_guard lock(s.mutex);
  const int othersAsleep = detail::completionSleepers.fetch_sub(1, std::memory_order_seq_cst) - 1;
  if (othersAsleep > 0 || s.fd < 0) return;
  uint64_t count;
  (void)::read(s.fd, &count, sizeof(count));  // nonblocking: EAGAIN when unrung
}

int CompletionSignal::fd() {
  return signalState().fd;
}

void CompletionSignal::wake() {
  const int fd = signalState().fd;
  if (fd < 0) return;
  const uint64_t one = 1;
  (void)::write(fd, &one, sizeof(one));
}

}  // namespace braid::transport
