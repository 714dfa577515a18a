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
  Status synchronize();
  Status query();

 private:
  void work(std::stop_token stop);

  std::shared_ptr<Communicator> comm_;
  const int index_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::vector<Operation>> queue_;
  bool busy_ = false;
  Status firstError_;
  std::jthread worker_;
};

}  // namespace braid
