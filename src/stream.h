// A host stream: a braid-owned thread that runs queued calls in order. The
// first error is latched and reported by synchronize() and query(), like a
// c10d Work or a CUDA stream's sticky error.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "src/common/status.h"
#include "src/communicator.h"

namespace braid {

class HostStream {
 public:
  HostStream(std::shared_ptr<Communicator> comm, int index);
  ~HostStream();  // waits for the queue, then stops the thread

  Communicator& communicator() { return *comm_; }
  int index() const { return index_; }

  void enqueue(std::vector<Operation> ops);
  // Runs `callback` on the stream's thread once every call queued before it
  // has finished, with the first error so far (or ok).
  void enqueueCallback(std::function<void(const Status&)> callback);
  // Runs `task` on the stream's thread once every call queued before it has
  // finished, with the first error so far (or ok); what it returns counts as
  // a call's outcome. Unlike a call it runs after an error too, so that it
  // can release what waits on it (a CUDA stream held for the call).
  void enqueueTask(std::function<Status(const Status& earlier)> task);
  // Fails with kInvalidUsage on the stream's own thread (inside a callback),
  // where waiting for the queue would wait for itself.
  Status synchronize();
  Status query();
  bool onWorkerThread() const { return std::this_thread::get_id() == worker_.get_id(); }

 private:
  struct Entry {
    std::vector<Operation> ops;
    std::function<void(const Status&)> callback;  // set: this entry is a callback
    std::function<Status(const Status&)> task;    // set: this entry is a task
  };
  void work(std::stop_token stop);

  std::shared_ptr<Communicator> comm_;
  const int index_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Entry> queue_;
  bool busy_ = false;
  Status firstError_;
  std::jthread worker_;
};

}  // namespace braid
