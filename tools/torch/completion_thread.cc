// CompletionThread; see completion_thread.h.
#include "completion_thread.h"

#include <c10/util/Exception.h>

#include <exception>
#include <utility>

namespace braid_torch {

namespace {
thread_local const void* currentCompletionThread = nullptr;
}  // namespace

CompletionThread::~CompletionThread() {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stopping = true;
  }
  shared_->ready.notify_all();
  std::lock_guard<std::mutex> lock(threadMutex_);
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id())
    thread_.detach();  // ends once this completion returns and the queue is empty
  else
    thread_.join();
}

bool CompletionThread::isCurrent() const {
  return currentCompletionThread == shared_.get();
}

void CompletionThread::post(std::function<void()> completion) {
  {
    std::lock_guard<std::mutex> lock(threadMutex_);
    if (!thread_.joinable()) {
      try {
        thread_ = std::thread(&CompletionThread::run, shared_);
      } catch (const std::exception& e) {
        TORCH_WARN("braid: no thread for future callbacks (", e.what(), "); running them here");
        completion();
        return;
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->queue.push_back(std::move(completion));
  }
  shared_->ready.notify_one();
}

void CompletionThread::run(std::shared_ptr<Shared> shared) {
  currentCompletionThread = shared.get();
  std::unique_lock<std::mutex> lock(shared->mutex);
  for (;;) {
    shared->ready.wait(lock, [&] { return !shared->queue.empty() || shared->stopping; });
    if (shared->queue.empty()) break;  // stopping, and nothing left
    std::function<void()> completion = std::move(shared->queue.front());
    shared->queue.pop_front();
    lock.unlock();
    try {
      completion();
    } catch (const std::exception& e) {
      TORCH_WARN("braid: a future's completion failed: ", e.what());
    } catch (...) {
      TORCH_WARN("braid: a future's completion failed");
    }
    completion = nullptr;  // what it held goes before the next wait
    lock.lock();
  }
}

}  // namespace braid_torch
