// The API tests judge a call by its braidResult_t and by the message
// braidGetLastError() leaves, since that message is all an application gets
// to tell what went wrong. Checking both the same way in every file keeps a
// stale message or an unrelated word from passing in one and not another.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include "braid.h"

namespace braid_api_test {

// Whether `word` occurs in `text` as a whole identifier (case-insensitive), so
// that "op" is not found inside "operation".
inline bool mentions(const std::string& text, const std::string& word) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  std::string t = lower(text), w = lower(word);
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t pos = t.find(w); pos != std::string::npos; pos = t.find(w, pos + 1)) {
    bool before = pos == 0 || !ident(t[pos - 1]);
    bool after = pos + w.size() == t.size() || !ident(t[pos + w.size()]);
    if (before && after) return true;
  }
  return false;
}

}  // namespace braid_api_test

// Runs `call` after leaving a known, different message behind (so a stale
// message cannot pass), then checks the result and that the new message
// names every one of `words`.
#define EXPECT_BRAID_ERROR(call, expected, ...)                                                \
  do {                                                                                         \
    (void)braidGetVersion(nullptr); /* last error now names braidGetVersion */                 \
    braidResult_t got_ = (call);                                                               \
    std::string msg_ = braidGetLastError(nullptr);                                             \
    EXPECT_EQ(got_, (expected)) << #call << ": " << braidGetErrorString(got_) << ": " << msg_; \
    for (const char* w_ : {__VA_ARGS__})                                                       \
      EXPECT_TRUE(::braid_api_test::mentions(msg_, w_))                                        \
          << #call << ": message \"" << msg_ << "\" does not mention \"" << w_ << "\"";        \
  } while (0)

#define EXPECT_BRAID_OK(call)                                                     \
  do {                                                                            \
    braidResult_t got_ = (call);                                                  \
    EXPECT_EQ(got_, braidSuccess) << #call << ": " << braidGetLastError(nullptr); \
  } while (0)
