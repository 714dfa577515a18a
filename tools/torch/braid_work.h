// BraidWork: the c10d::Work (and its future) that a braid stream callback
// completes, for the braid torch backend.
#pragma once

#include <braid.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "completion_thread.h"

namespace braid_torch {

// Counts a process group's works not yet finished (the calls may be done,
// but the work has not said so): one, from construction until the work
// finishes or, never submitted, is destroyed.
class UnfinishedMark {
 public:
  explicit UnfinishedMark(std::shared_ptr<std::atomic<int>> count) : count_(std::move(count)) {
    if (count_) ++*count_;
  }
  UnfinishedMark(const UnfinishedMark&) = delete;
  UnfinishedMark& operator=(const UnfinishedMark&) = delete;
  ~UnfinishedMark() { release(); }
  void release() {
    if (count_) --*count_;
    count_.reset();
  }

 private:
  std::shared_ptr<std::atomic<int>> count_;
};

// A Work that a stream callback completes. It holds every tensor the queued
// calls touch until then, and runs `finishers` (copies out of staging
// buffers) before it completes.
class BraidWork : public c10d::Work {
 public:
  // `title` is "braid:<name>", as profiles show it.
  // `unfinished` counts it until it finishes (UnfinishedMark). Its future
  // completes on `completions`, which must outlive the stream callback.
  BraidWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
            std::shared_ptr<std::atomic<int>> unfinished, CompletionThread* completions);

  std::vector<at::Tensor> result() override { return outputs_; }

  // Completion is the work's and its future's: whoever sees one sees both.
  // The work finishes on braid's stream thread, in the order of the calls.
  // Its future completes there too while nobody has it (no callback can be
  // chained on it: a blocking call's), and where it was handed out on the
  // completion thread (which may wait for it); else on the completion
  // thread (completion_thread.h).
  bool isCompleted() override { return Work::isCompleted() && future_->completed(); }
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Keeps `t` alive until the work completes.
  void hold(const at::Tensor& t) { held_.push_back(t); }

  // A contiguous tensor with t's data for the calls to use; when t itself is
  // not contiguous, it is a staging copy, filled by a starter and copied back
  // into t on success if `copyBack`.
  at::Tensor dense(const at::Tensor& t, bool copyBack);

  // Runs `f` just before the calls, in the order of the stream (whatever the
  // calls queued before it wrote is seen): copies into staging tensors.
  void beforeCalls(std::function<void()> f) { starters_.push_back(std::move(f)); }
  bool hasStarters() const { return !starters_.empty(); }
  // Runs the starters now (inside a group, where no callback can be queued
  // between the calls).
  void runStarters();
  // braidStreamCallback_t that runs the starters; userData is a heap
  // intrusive_ptr to the work.
  static void onStreamStart(braidStream_t, braidResult_t status, void* userData);

  void onSuccess(std::function<void()> f) { finishers_.push_back(std::move(f)); }

  // braidStreamCallback_t; userData is a heap intrusive_ptr to the work.
  static void onStream(braidStream_t, braidResult_t status, void* userData);

 private:
  void complete(braidResult_t status, const char* message);
  void completeFuture(const std::exception_ptr& error);

  std::string name_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> held_;
  std::vector<std::function<void()>> starters_;
  std::exception_ptr startError_;  // a starter's, reported at completion
  std::vector<std::function<void()>> finishers_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex futureMutex_;        // orders getFuture against the completion
  bool futureHandedOut_ = false;  // guarded by futureMutex_
  UnfinishedMark unfinished_;
  CompletionThread* completions_;
};

}  // namespace braid_torch
