// Where a blocking exchange reads and writes: a socket bounded by a
// deadline, or bytes in memory. The handshake and the rendezvous protocol
// parse what a peer sent through a Wire, so the code that reads a socket is
// the code that unit tests and fuzzers feed with bytes of their own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "src/common/status.h"

namespace braid::tcp {

class Wire {
 public:
  virtual ~Wire() = default;
  virtual Status send(std::span<const uint8_t> data) = 0;
  // All of `data`, or an error (the peer closed, the deadline passed).
  virtual Status recv(std::span<uint8_t> data) = 0;
};

// What a peer sent, then closed; keeps whatever is sent to it.
class BufferWire final : public Wire {
 public:
  explicit BufferWire(std::span<const uint8_t> input) : input_(input.begin(), input.end()) {}

  Status send(std::span<const uint8_t> data) override {
    sent_.insert(sent_.end(), data.begin(), data.end());
    return Status::ok();
  }
  Status recv(std::span<uint8_t> data) override {
    if (data.size() > input_.size() - read_) {
      read_ = input_.size();
      return remoteError("connection closed by the peer");
    }
    if (!data.empty()) std::memcpy(data.data(), input_.data() + read_, data.size());
    read_ += data.size();
    return Status::ok();
  }

  const std::vector<uint8_t>& sent() const { return sent_; }
  size_t unread() const { return input_.size() - read_; }

 private:
  std::vector<uint8_t> input_;
  size_t read_ = 0;
  std::vector<uint8_t> sent_;
};

}  // namespace braid::tcp
