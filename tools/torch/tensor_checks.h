// Errors, dtype and ReduceOp mapping, and tensor argument checks for the
// braid torch backend (braid_torch.cc, braid_work.cc).
#pragma once

#include <braid.h>

#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

namespace braid_torch {

[[noreturn]] void fail(const std::string& message);

// The exception for a failed braid call: its code's name and braid's
// message (braidGetLastError of this thread).
std::runtime_error braidError(const std::string& what, braidResult_t result, const char* message);

void check(braidResult_t result, const std::string& what);

// The braid type of a tensor that is reduced; data that is only moved goes
// as bytes, so every dtype can be moved.
braidDataType_t reductionType(const at::Tensor& t);

braidRedOp_t reductionOp(const c10d::ReduceOp& op);

void checkCpu(const at::Tensor& t, const char* what);

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what);

size_t bytesOf(const at::Tensor& t);

}  // namespace braid_torch
