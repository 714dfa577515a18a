// Wakes the threads that sleep in the progress engine when another thread
// finishes a request they may wait for. The threads of several braid
// streams share one connection, and whichever progresses it may complete
// another's request, or drain the doorbell a peer rang for another, while
// that one sleeps in poll(2) on descriptors that will not turn readable
// again: without a word it would sleep out its poll's timeout.
//
// One signal for the process: an eventfd that every sleeper polls. A
// completion writes it only while some thread sleeps (one atomic load
// otherwise); the last sleeper to wake drains it. A wake-up meant for
// another thread costs a sleeper one pass of its loop.
#pragma once

#include <atomic>

namespace braid::transport {

namespace detail {
// The number of sleepers, for notify()'s quick look.
inline std::atomic<int> completionSleepers{0};
}  // namespace detail

class CompletionSignal {
 public:
  // Before sleeping: counts the caller among the sleepers. The caller then
  // looks at its requests once more (one that completed before this is
  // seen there; one that completes after it wakes the caller) and, if none
  // is done, polls fd() with its other descriptors.
  static void beginSleep();
  // After the poll, whether it slept or not.
  static void endSleep();
  // The descriptor to poll for POLLIN; -1 if none could be made (sleepers
  // then wake by their poll's timeout, as without the signal).
  static int fd();
  // A request changed state, or a doorbell rung for some sleeper was
  // drained by another thread: wakes the sleepers, if there are any.
  static void notify() {
    if (detail::completionSleepers.load(std::memory_order_seq_cst) > 0) wake();
  }

 private:
  static void wake();
};

}  // namespace braid::transport
