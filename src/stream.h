// A host stream: a braid-owned thread that runs queued calls in order. The
// first error is latched and reported by synchronize() and query(), like a
// c10d Work or a CUDA stream's sticky error.
//
// Handing a call to a sleeping thread and waking its waiter costs two
// futex wake-ups, tens of microseconds on a VM, against well under one for
// a small call itself. So where the host has two cores for each of its
// ranks, the worker, once its queue is empty, and a synchronize() whose
// calls are still running first poll for up to 50 us (less if
// BRAID_SPIN_US says so), yielding the core on every pass, and only then
// sleep. A small call is done well within that; a larger one takes long
// enough for the wake-up not to count. With fewer cores the polling
// threads would keep the ones with work off the cores: 2 ranks on 2 cores
// (with PyTorch's waiting thread polling as well) read a 1 MiB
// AllReduce 3x slower in half of the launches.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "src/common/status.h"
#include "src/communicator.h"

namespace braid {

// How long a stream's worker and its waiters poll before they sleep: up to
// 50 us of `spinSeconds` (BRAID_SPIN_US) where the host has two cores for
// each of its ranks, else not at all.
double streamSpinSeconds(int ranksOnHost, int coresOnHost, double spinSeconds);

class HostStream {
 public:
  HostStream(std::shared_ptr<Communicator> comm, int index);
  ~HostStream();  // waits for the queue, then stops the thread

  // Only while it has one: a task, which runs only after no failure, may
  // ask (a stream of a destroyed communicator fails everything queued).
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
  // For braidCommDestroy, once the stream is synchronized: lets go of the
  // communicator, so that a stream handle the program keeps holds nothing
  // of it (its connections, shared memory, GPU memory) but this thread.
  // Whatever is queued later fails, callbacks told so.
  void detachFromCommunicator();

 private:
  struct Entry {
    std::vector<Operation> ops;
    std::function<void(const Status&)> callback;  // set: this entry is a callback
    std::function<Status(const Status&)> task;    // set: this entry is a task
  };
  // Queues `entry` and wakes the worker.
  void push(Entry entry);
  void work(std::stop_token stop);
  // Polls, yielding the core, until `done` or the spin time is over.
  template <typename Done>
  void spinUntil(Done done) const;

  std::shared_ptr<Communicator> comm_;  // guarded by mutex_; null once detached
  const int index_;
  const double spinSeconds_;  // the communicator's streamSpinSeconds()
  std::mutex mutex_;
  // Two conditions, so that neither side wakes the other for nothing: the
  // worker waits for entries; synchronize() waits for the queue to drain,
  // and is woken only then, not after every call (a waiter woken for each
  // of a batch of small calls took the core from the worker: 10-14 us a
  // call instead of 1.5 us, 2 ranks on 2 cores).
  std::condition_variable queuedMore_;
  std::condition_variable drained_;
  std::deque<Entry> queue_;
  bool busy_ = false;
  // Entries ever queued and ever finished: what the polling looks at
  // without the mutex.
  std::atomic<uint64_t> queued_{0}, finished_{0};
  Status firstError_;
  std::jthread worker_;
};

}  // namespace braid
