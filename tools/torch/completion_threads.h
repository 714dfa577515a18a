// CompletionThreads: where a process group's futures complete. Completing
// a c10 future runs the callbacks chained on it, and a callback may wait
// for another call of the same group (PyTorch's powerSGD hook waits on an
// all_reduce inside one, two deep). On braid's stream thread that call
// would queue behind the waiting callback for ever; here a completion
// finds an idle thread or starts one, so a waiting callback never holds
// up the completions it waits for (gloo's process group runs its works and
// their callbacks on a pool of threads for the same reason). Threads, once
// started, stay until the pool goes; at most kMostThreads.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace braid_torch {

class CompletionThreads {
 public:
  // More than this many callbacks waiting at once is not a pattern
  // anyone uses; past it, completions queue for the threads there are.
  static constexpr int kMostThreads = 64;

  CompletionThreads();
  // Runs what is queued, then joins the threads (not the calling one, when
  // a completion drops the last reference to the group).
  ~CompletionThreads();
  CompletionThreads(const CompletionThreads&) = delete;
  CompletionThreads& operator=(const CompletionThreads&) = delete;

  // Runs `completion` on a thread of the pool, soon.
  void post(std::function<void()> completion);

 private:
  // Shared with the threads, so that one left running the completion that
  // destroyed the pool reads no freed memory.
  struct Shared {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::function<void()>> queue;
    int idle = 0;
    int started = 0;
    bool stopping = false;
  };
  static void run(std::shared_ptr<Shared> shared);

  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  std::mutex threadsMutex_;
  std::vector<std::thread> threads_;
};

}  // namespace braid_torch
