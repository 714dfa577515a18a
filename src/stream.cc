#include "src/stream.h"

namespace braid {

HostStream::HostStream(std::shared_ptr<Communicator> comm, int index)
    : comm_(std::move(comm)), index_(index), worker_([this](std::stop_token s) { work(s); }) {}

HostStream::~HostStream() {
  (void)synchronize();
  worker_.request_stop();
  changed_.notify_all();
}

void HostStream::enqueue(std::vector<Operation> ops) {
  std::lock_guard lock(mutex_);
  queue_.push_back({std::move(ops), nullptr, nullptr});
  changed_.notify_all();
}

void HostStream::enqueueCallback(std::function<void(const Status&)> callback) {
  std::lock_guard lock(mutex_);
  queue_.push_back({{}, std::move(callback), nullptr});
  changed_.notify_all();
}

void HostStream::enqueueTask(std::function<Status(const Status& earlier)> task) {
  std::lock_guard lock(mutex_);
  queue_.push_back({{}, nullptr, std::move(task)});
  changed_.notify_all();
}

Status HostStream::synchronize() {
  if (onWorkerThread())
    return invalidUsage("a stream cannot wait for itself from one of its own callbacks");
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return queue_.empty() && !busy_; });
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
    changed_.wait(lock, [&] { return stop.stop_requested() || !queue_.empty(); });
    if (queue_.empty()) return;
    Entry entry = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    if (entry.callback) {
      Status outcome = firstError_;
      lock.unlock();
      entry.callback(outcome);
      lock.lock();
      busy_ = false;
      changed_.notify_all();
      continue;
    }
    const Status earlier = firstError_;
    lock.unlock();
    // After a failure the stream's state is undefined; later calls are not
    // run (their ranks would wait for a partner that already gave up).
    Status s = entry.task       ? entry.task(earlier)
               : earlier.isOk() ? comm_->run(entry.ops, index_)
                                : Status::ok();
    lock.lock();
    if (!s.isOk() && firstError_.isOk()) {
      firstError_ = s;
      comm_->recordAsyncError(s);
    }
    busy_ = false;
    changed_.notify_all();
  }
}

}  // namespace braid
