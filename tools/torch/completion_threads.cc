// CompletionThreads; see completion_threads.h.
#include "completion_threads.h"

#include <utility>

namespace braid_torch {

CompletionThreads::CompletionThreads() = default;

CompletionThreads::~CompletionThreads() {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stopping = true;
  }
  shared_->ready.notify_all();
  std::lock_guard<std::mutex> lock(threadsMutex_);
  for (std::thread& t : threads_) {
    if (t.get_id() == std::this_thread::get_id())
      t.detach();  // ends once this completion returns and the queue is empty
    else
      t.join();
  }
}

void CompletionThreads::post(std::function<void()> completion) {
  bool start = false;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->queue.push_back(std::move(completion));
    // More queued than threads waiting for work: the busy ones may be
    // waiting for this very completion.
    if (static_cast<int>(shared_->queue.size()) > shared_->idle &&
        shared_->started < kMostThreads) {
      start = true;
      ++shared_->started;
      ++shared_->idle;  // counted as waiting until it takes its first entry
    }
  }
  if (start) {
    std::lock_guard<std::mutex> lock(threadsMutex_);
    threads_.emplace_back(&CompletionThreads::run, shared_);
  } else {
    shared_->ready.notify_one();
  }
}

void CompletionThreads::run(std::shared_ptr<Shared> shared) {
  std::unique_lock<std::mutex> lock(shared->mutex);
  for (;;) {
    shared->ready.wait(lock, [&] { return !shared->queue.empty() || shared->stopping; });
    if (shared->queue.empty()) break;  // stopping, and nothing left
    std::function<void()> completion = std::move(shared->queue.front());
    shared->queue.pop_front();
    --shared->idle;
    lock.unlock();
    completion();
    completion = nullptr;  // what it held goes before the next wait
    lock.lock();
    ++shared->idle;
  }
  --shared->idle;
}

}  // namespace braid_torch
