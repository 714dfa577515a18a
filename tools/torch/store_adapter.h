// StoreAdapter: braid's store callbacks (braidStore_t) over a c10d::Store,
// through which braid_torch bootstraps a communicator.
#pragma once

#include <braid.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace braid_torch {

// braidStore_t over a c10d::Store. Store failures are exceptions; they
// become error codes here, and their text is kept for the init error.
struct StoreAdapter {
  c10d::Store* store;
  std::string lastError;

  // c10::Error's what() carries a C++ backtrace; the message alone reads better.
  static std::string messageOf(const std::exception& e) {
    if (const auto* c10Error = dynamic_cast<const c10::Error*>(&e))
      return c10Error->what_without_backtrace();
    return e.what();
  }

  static braidResult_t set(void* context, const char* key, const void* value, size_t bytes) {
    auto* self = static_cast<StoreAdapter*>(context);
    try {
      const auto* p = static_cast<const uint8_t*>(value);
      self->store->set(key, std::vector<uint8_t>(p, p + bytes));
      return braidSuccess;
    } catch (const std::exception& e) {
      self->lastError = messageOf(e);
      return braidSystemError;
    }
  }

  static braidResult_t get(void* context, const char* key, void* value, size_t capacity,
                           size_t* bytes, double timeoutSeconds) {
    auto* self = static_cast<StoreAdapter*>(context);
    auto start = std::chrono::steady_clock::now();
    auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutSeconds * 1000));
    try {
      self->store->wait({key}, timeout);
      std::vector<uint8_t> v = self->store->get(key);
      *bytes = v.size();
      std::memcpy(value, v.data(), std::min(capacity, v.size()));
      return braidSuccess;
    } catch (const std::exception& e) {
      self->lastError = messageOf(e);
      return std::chrono::steady_clock::now() - start >= timeout ? braidTimeout : braidSystemError;
    }
  }
};

}  // namespace braid_torch
