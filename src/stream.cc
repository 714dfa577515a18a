#include "src/stream.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

namespace braid {

double streamSpinSeconds(int ranksOnHost, int coresOnHost, double spinSeconds) {
  if (ranksOnHost < 1 || 2 * ranksOnHost > coresOnHost) return 0;
  return std::min(spinSeconds, 50e-6);
}

template <typename Done>
void HostStream::spinUntil(Done done) const {
  using Clock = std::chrono::steady_clock;
  const double seconds = spinSeconds_;
  if (seconds <= 0) return;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    // A clock read costs about as much as a yield; look a few times between.
    for (int i = 0; i < 16; ++i) {
      sched_yield();
      if (done()) return;
    }
    if (Clock::now() >= end) return;
  }
}

HostStream::HostStream(std::shared_ptr<Communicator> comm, int index)
    : comm_(std::move(comm)),
      index_(index),
      spinSeconds_(comm_->streamSpinSeconds()),
      worker_([this](std::stop_token s) { work(s); }) {}

void HostStream::detachFromCommunicator() {
  std::shared_ptr<Communicator> last;
  {
    std::lock_guard lock(mutex_);
    last = std::move(comm_);
  }
  // `last` goes, and with it maybe the communicator, outside the mutex.
}

HostStream::~HostStream() {
  (void)synchronize();
  {
    // Under the mutex: the worker may have found no stop requested and be
    // about to wait, and would miss a wake-up sent in between.
    std::lock_guard lock(mutex_);
    worker_.request_stop();
  }
  queuedMore_.notify_all();
}

void HostStream::push(Entry entry) {
  std::lock_guard lock(mutex_);
  queue_.push_back(std::move(entry));
  queued_.fetch_add(1, std::memory_order_release);
  queuedMore_.notify_one();
}

void HostStream::enqueue(std::vector<Operation> ops) {
  push({std::move(ops), nullptr, nullptr});
}

void HostStream::enqueueCallback(std::function<void(const Status&)> callback) {
  push({{}, std::move(callback), nullptr});
}

void HostStream::enqueueTask(std::function<Status(const Status& earlier)> task) {
  push({{}, nullptr, std::move(task)});
}

Status HostStream::synchronize() {
  if (onWorkerThread())
    return invalidUsage("a stream cannot wait for itself from one of its own callbacks");
  const uint64_t queued = queued_.load(std::memory_order_acquire);
  spinUntil([&] { return finished_.load(std::memory_order_acquire) >= queued; });
  std::unique_lock lock(mutex_);
  drained_.wait(lock, [&] { return queue_.empty() && !busy_; });
  return firstError_;
}

Status HostStream::query() {
  std::lock_guard lock(mutex_);
  if (!firstError_.isOk()) return firstError_;
  if (!queue_.empty() || busy_) return Status(ErrorCode::kInProgress, "calls still running");
  return Status::ok();
}

void HostStream::work(std::stop_token stop) {
  std::unique_lock lock(mutex_);
  while (true) {
    if (queue_.empty() && !stop.stop_requested()) {
      const uint64_t finished = finished_.load(std::memory_order_relaxed);
      lock.unlock();
      spinUntil([&] {
        return queued_.load(std::memory_order_acquire) > finished || stop.stop_requested();
      });
      lock.lock();
    }
    queuedMore_.wait(lock, [&] { return stop.stop_requested() || !queue_.empty(); });
    if (queue_.empty()) return;
    Entry entry = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    // A stream whose communicator was destroyed runs nothing of it; a
    // task, which must still run (it may release a CUDA stream), and a
    // callback are told so.
    const std::shared_ptr<Communicator> comm = comm_;
    const Status earlier =
        comm ? firstError_ : invalidUsage("the stream's communicator was destroyed");
    lock.unlock();
    // After a failure the stream's state is undefined; later calls are not
    // run (their ranks would wait for a partner that already gave up).
    // Callbacks run always, and are told of it.
    // As at the C ABI (guard), a throw fails the call, not the process.
    const Status s = caughtAsStatus([&]() -> Status {
      if (entry.callback) {
        entry.callback(earlier);
        return Status::ok();
      }
      if (entry.task) return entry.task(earlier);
      if (!comm) return earlier;
      return earlier.isOk() ? comm->run(entry.ops, index_) : Status::ok();
    });
    lock.lock();
    if (!s.isOk() && firstError_.isOk()) {
      firstError_ = s;
      if (comm) comm->recordAsyncError(s);
    }
    busy_ = false;
    finished_.fetch_add(1, std::memory_order_release);
    if (queue_.empty()) drained_.notify_all();
  }
}

}  // namespace braid
