// The calls application threads are making on one communicator, counted so
// that braidCommDestroy can wait for them to end, as it promises ("waits for
// this rank's outstanding work"), rather than pull the connections, and then
// the communicator, out from under them. Calls on a braid stream are waited
// for by synchronizing the stream instead.
#pragma once

#include <condition_variable>
#include <mutex>

namespace braid {

class CallsInFlight {
 public:
  // One call, counted while it lives.
  class Entered {
   public:
    explicit Entered(CallsInFlight& calls) : calls_(&calls) {
      std::lock_guard lock(calls_->mutex_);
      ++calls_->count_;
    }
    ~Entered() {
      if (calls_ == nullptr) return;
      // Notified under the lock: the waiter may free `calls_` as soon as it
      // holds the lock again.
      std::lock_guard lock(calls_->mutex_);
      if (--calls_->count_ == 0) calls_->none_.notify_all();
    }
    Entered(Entered&& other) noexcept : calls_(other.calls_) { other.calls_ = nullptr; }
    Entered(const Entered&) = delete;
    Entered& operator=(const Entered&) = delete;
    Entered& operator=(Entered&&) = delete;

   private:
    CallsInFlight* calls_;
  };

  Entered enter() { return Entered(*this); }

  // Returns once no call is counted.
  void awaitNone() {
    std::unique_lock lock(mutex_);
    none_.wait(lock, [&] { return count_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable none_;
  int count_ = 0;
};

}  // namespace braid
