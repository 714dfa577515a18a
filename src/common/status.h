// Status and Result<T>: how errors travel inside braid. They are values, not
// exceptions, because they cross threads (streams, the progress engine) and
// end at a C ABI that must never see an exception.
#pragma once

#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace braid {

// Mirrors braidResult_t one to one, so the ABI edge maps by value.
enum class ErrorCode : uint8_t {
  kOk = 0,
  kSystemError = 1,
  kInternalError = 2,
  kInvalidArgument = 3,
  kInvalidUsage = 4,
  kRemoteError = 5,
  kInProgress = 6,
  kTimeout = 7,
  kUnhandledCudaError = 8,
  kNotSupported = 9,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool isOk() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return isOk(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes the message with where it happened, keeping the code.
  Status withContext(const std::string& where) const {
    if (isOk()) return *this;
    return Status(code_, where + ": " + message_);
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status systemError(std::string m) {
  return {ErrorCode::kSystemError, std::move(m)};
}
inline Status internalError(std::string m) {
  return {ErrorCode::kInternalError, std::move(m)};
}

// Runs `body` (returning Status) and turns an exception it throws into the
// Status it means, so that none leaves braid's threads or its C ABI: out of
// memory for std::bad_alloc and std::length_error, an internal error for any
// other.
template <typename Body>
Status caughtAsStatus(Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return systemError("out of memory");
  } catch (const std::length_error& e) {  // a container asked for more than any allocator has
    return systemError(std::string("out of memory: ") + e.what());
  } catch (const std::exception& e) {
    return internalError(e.what());
  } catch (...) {
    return internalError("unknown exception");
  }
}
inline Status invalidArgument(std::string m) {
  return {ErrorCode::kInvalidArgument, std::move(m)};
}
inline Status invalidUsage(std::string m) {
  return {ErrorCode::kInvalidUsage, std::move(m)};
}
inline Status remoteError(std::string m) {
  return {ErrorCode::kRemoteError, std::move(m)};
}
inline Status timeoutError(std::string m) {
  return {ErrorCode::kTimeout, std::move(m)};
}
inline Status notSupported(std::string m) {
  return {ErrorCode::kNotSupported, std::move(m)};
}

// errno-level failure: "what: strerror(err)".
Status errnoStatus(const std::string& what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.isOk()) status_ = internalError("Result made from an ok Status, without a value");
  }

  bool isOk() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  std::optional<T> value_;
  // Ok while a value is held. No default message: a Result is made on every
  // pass of the progress loop, and a message longer than the short-string
  // buffer would cost an allocation each time.
  Status status_;
};

}  // namespace braid

#define BRAID_CONCAT_INNER(a, b) a##b
#define BRAID_CONCAT(a, b) BRAID_CONCAT_INNER(a, b)

#define BRAID_RETURN_IF_ERROR(expr)                  \
  do {                                               \
    ::braid::Status braid_status_ = (expr);          \
    if (!braid_status_.isOk()) return braid_status_; \
  } while (0)

#define BRAID_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.isOk()) return tmp.status();             \
  lhs = std::move(tmp).value()

#define BRAID_ASSIGN_OR_RETURN(lhs, expr) \
  BRAID_ASSIGN_OR_RETURN_IMPL(BRAID_CONCAT(braid_result_, __LINE__), lhs, expr)
