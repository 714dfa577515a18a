// CompletionThread: where a process group's futures that were handed out
// complete. Completing a c10 future runs the callbacks chained on it, and a
// callback may make calls of the same group and wait for them (PyTorch's
// powerSGD hook does, two deep). On braid's stream thread such a call would
// queue behind the waiting callback for ever; here it does not. One thread,
// first in first out: callbacks run one at a time in the order their calls
// finished, so the calls they make are queued in the same order on every
// rank. A future handed out on this thread (a callback's own call) completes
// on braid's stream thread instead, so that this thread can wait for it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace braid_torch {

class CompletionThread {
 public:
  CompletionThread() = default;
  // Runs what is queued, then joins the thread (not when called on it, as
  // when a callback drops the last reference to the group).
  ~CompletionThread();
  CompletionThread(const CompletionThread&) = delete;
  CompletionThread& operator=(const CompletionThread&) = delete;

  // Runs `completion` on the thread, after those posted before. Where no
  // thread can be started, runs it here.
  void post(std::function<void()> completion);

  // Whether the caller is this thread.
  bool isCurrent() const;

 private:
  // Shared with the thread, so that it reads no freed memory when a
  // completion destroyed its owner.
  struct Shared {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::function<void()>> queue;
    bool stopping = false;
  };
  static void run(std::shared_ptr<Shared> shared);

  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  std::mutex threadMutex_;
  std::thread thread_;  // started by the first post
};

}  // namespace braid_torch
