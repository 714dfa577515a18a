// BraidWork: the c10d::Work (and its future) that a braid stream callback
// completes; see braid_work.h.
#include "braid_work.h"

#include <cstring>
#include <exception>
#include <utility>

#include "tensor_checks.h"

namespace braid_torch {

BraidWork::BraidWork(int rank, c10d::OpType type, const char* title,
                     std::vector<at::Tensor> outputs)
    : Work(rank, type, title),
      name_(title + std::strlen("braid:")),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

bool BraidWork::wait(std::chrono::milliseconds timeout) {
  bool done = Work::wait(timeout);  // throws the work's error
  future_->wait();
  return done;
}

at::Tensor BraidWork::dense(const at::Tensor& t, bool copyBack) {
  hold(t);
  if (t.is_contiguous()) return t;
  at::Tensor staged = t.contiguous();
  hold(staged);
  if (copyBack) finishers_.push_back([t, staged]() mutable { t.copy_(staged); });
  return staged;
}

void BraidWork::onStream(braidStream_t, braidResult_t status, void* userData) {
  c10::intrusive_ptr<BraidWork> work(
      std::move(*static_cast<c10::intrusive_ptr<BraidWork>*>(userData)));
  delete static_cast<c10::intrusive_ptr<BraidWork>*>(userData);
  work->complete(status, braidGetLastError(nullptr));
}

void BraidWork::complete(braidResult_t status, const char* message) {
  std::exception_ptr error;
  if (status != braidSuccess) {
    error = std::make_exception_ptr(braidError(name_, status, message));
  } else {
    try {
      for (auto& f : finishers_) f();
    } catch (...) {
      error = std::current_exception();
    }
  }
  finishers_.clear();
  held_.clear();
  finish(error);
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

}  // namespace braid_torch
