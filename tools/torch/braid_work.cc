// BraidWork: the c10d::Work (and its future) that a braid stream callback
// completes; see braid_work.h.
#include "braid_work.h"

#include <ATen/core/LegacyTypeDispatch.h>

#include <cstring>
#include <exception>
#include <utility>

#include "tensor_checks.h"

namespace braid_torch {

BraidWork::BraidWork(int rank, c10d::OpType type, const char* title,
                     std::vector<at::Tensor> outputs, std::shared_ptr<std::atomic<int>> unfinished,
                     CompletionThread* completions)
    : Work(rank, type, title),
      name_(title + std::strlen("braid:")),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
      unfinished_(std::move(unfinished)),
      completions_(completions) {}

bool BraidWork::wait(std::chrono::milliseconds timeout) {
  bool done = Work::wait(timeout);  // throws the work's error
  future_->wait();
  return done;
}

at::Tensor BraidWork::dense(const at::Tensor& t, bool copyBack) {
  hold(t);
  if (t.is_contiguous()) return t;
  // Filled when the calls run, not now: a call queued before on the stream
  // may still write t (a contiguous t is read then too).
  at::Tensor staged = at::empty_like(t, at::MemoryFormat::Contiguous);
  hold(staged);
  beforeCalls([t, staged]() mutable { staged.copy_(t); });
  if (copyBack) finishers_.push_back([t, staged]() mutable { t.copy_(staged); });
  return staged;
}

namespace {

// The copies into and out of the caller's tensors run on braid's stream
// thread, which has none of the caller's autograd settings: below autograd
// and the in-place checks, as a raw write (gloo's) is, they work on
// inference tensors (torch.inference_mode) and on outputs that require grad
// alike.
template <typename Copies>
std::exception_ptr runBelowAutograd(Copies& copies) {
  try {
    at::AutoDispatchBelowADInplaceOrView belowAutograd;
    for (auto& f : copies) f();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

c10::intrusive_ptr<BraidWork> takeWork(void* userData) {
  auto* ref = static_cast<c10::intrusive_ptr<BraidWork>*>(userData);
  c10::intrusive_ptr<BraidWork> work(std::move(*ref));
  delete ref;
  return work;
}

}  // namespace

void BraidWork::runStarters() {
  if (!startError_) startError_ = runBelowAutograd(starters_);
  starters_.clear();
}

void BraidWork::onStreamStart(braidStream_t, braidResult_t, void* userData) {
  takeWork(userData)->runStarters();
}

void BraidWork::onStream(braidStream_t, braidResult_t status, void* userData) {
  takeWork(userData)->complete(status, braidGetLastError(nullptr));
}

void BraidWork::complete(braidResult_t status, const char* message) {
  std::exception_ptr error = startError_;
  if (error) {
  } else if (status != braidSuccess) {
    error = std::make_exception_ptr(braidError(name_, status, message));
  } else {
    error = runBelowAutograd(finishers_);
  }
  finishers_.clear();
  held_.clear();
  // Before wait() can return: a group destroyed right after it must not
  // count this work as pending while its callback is still on the stream.
  unfinished_.release();
  finish(error);
  {
    // Completing a future nobody was handed runs no callback: here, at once
    // (a blocking call's caller wakes without another thread's hand-off).
    // A getFuture() waits, then gets a completed future.
    std::lock_guard<std::mutex> lock(futureMutex_);
    if (!futureHandedOut_) {
      completeFuture(error);
      return;
    }
  }
  // Its callbacks may make calls of this group and wait for them.
  completions_->post([self = c10::intrusive_ptr<BraidWork>::reclaim_copy(this), error] {
    self->completeFuture(error);
  });
}

void BraidWork::completeFuture(const std::exception_ptr& error) {
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

c10::intrusive_ptr<c10::ivalue::Future> BraidWork::getFuture() {
  std::lock_guard<std::mutex> lock(futureMutex_);
  // A callback's own call: the completion thread runs the callback and may
  // wait for this future, so the completion thread must not complete it.
  if (!completions_->isCurrent()) futureHandedOut_ = true;
  return future_;
}

}  // namespace braid_torch
