// What a perf binary does when a braid call fails, and the declared buffers
// of -R/--local_register.
#pragma once

#include <braid.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace braid::perf {

// Prints which call failed and why, then aborts the communicator, so that
// the other ranks stop instead of waiting for this one, and exits.
[[noreturn]] inline void failRun(braidComm_t comm, braidResult_t result, const std::string& what) {
  std::fprintf(stderr, "%s failed: %s: %s\n", what.c_str(), braidGetErrorString(result),
               braidGetLastError(comm));
  (void)braidCommAbort(comm);
  std::exit(1);
}

// A braidCommRegister declaration, ended when it goes out of scope.
class Registration {
 public:
  Registration() = default;
  Registration(braidComm_t comm, void* buffer, size_t bytes) : comm_(comm) {
    const braidResult_t result =
        braidCommRegister(comm, buffer, std::max<size_t>(bytes, 1), &handle_);
    if (result != braidSuccess) failRun(comm_, result, "braidCommRegister");
  }
  Registration(Registration&& other) noexcept { *this = std::move(other); }
  Registration& operator=(Registration&& other) noexcept {
    std::swap(comm_, other.comm_);
    std::swap(handle_, other.handle_);
    return *this;
  }
  ~Registration() {
    if (handle_ == nullptr) return;
    const braidResult_t result = braidCommDeregister(comm_, handle_);
    if (result != braidSuccess) failRun(comm_, result, "braidCommDeregister");
  }

 private:
  braidComm_t comm_ = nullptr;
  void* handle_ = nullptr;
};

}  // namespace braid::perf
