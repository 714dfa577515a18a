// Errors, dtype and ReduceOp mapping, and tensor argument checks for the
// braid torch backend.
#include "tensor_checks.h"

#include <string>

namespace braid_torch {

[[noreturn]] void fail(const std::string& message) {
  throw std::runtime_error("braid: " + message);
}

// The exception for a failed braid call: its code's name and braid's
// message (braidGetLastError of this thread).
std::runtime_error braidError(const std::string& what, braidResult_t result, const char* message) {
  std::string text = "braid: " + what + " failed (" + braidGetErrorString(result) + ")";
  if (message && *message) text += ": " + std::string(message);
  return std::runtime_error(text);
}

void check(braidResult_t result, const std::string& what) {
  if (result != braidSuccess) throw braidError(what, result, braidGetLastError(nullptr));
}

// The braid type of a tensor that is reduced; data that is only moved goes
// as bytes, so every dtype can be moved.
braidDataType_t reductionType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kChar:
      return braidInt8;
    case at::kByte:
      return braidUint8;
    case at::kInt:
      return braidInt32;
    case at::kLong:
      return braidInt64;
    case at::kHalf:
      return braidFloat16;
    case at::kBFloat16:
      return braidBfloat16;
    case at::kFloat:
      return braidFloat32;
    case at::kDouble:
      return braidFloat64;
    default:
      fail(std::string("reductions of ") + c10::toString(t.scalar_type()) +
           " tensors are not supported (supported: int8, uint8, int32, int64, float16, "
           "bfloat16, float32, float64)");
  }
}

braidRedOp_t reductionOp(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return braidSum;
    case c10d::ReduceOp::PRODUCT:
      return braidProd;
    case c10d::ReduceOp::MIN:
      return braidMin;
    case c10d::ReduceOp::MAX:
      return braidMax;
    case c10d::ReduceOp::AVG:
      return braidAvg;
    default:
      fail("ReduceOp " + std::to_string(static_cast<int>(op.op_)) +
           " (BAND, BOR, BXOR or PREMUL_SUM) is not supported; use SUM, PRODUCT, MIN, MAX "
           "or AVG");
  }
}

void checkCpu(const at::Tensor& t, const char* what) {
  if (!t.defined()) fail(std::string(what) + " is an undefined tensor");
  if (!t.device().is_cpu())
    fail(std::string(what) + " is on " + t.device().str() + "; this build of braid_torch " +
         "handles CPU tensors only");
  if (t.layout() != at::kStrided) fail(std::string(what) + " is not a dense (strided) tensor");
}

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1)
    fail(std::string(what) + ": expected one tensor, got " + std::to_string(tensors.size()) +
         " (one tensor per process)");
  return tensors[0];
}

size_t bytesOf(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * t.element_size();
}

}  // namespace braid_torch
