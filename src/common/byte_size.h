// Sizes as people type them on a command line: "4096", "64K", "32M", "1G"
// (K, M and G are powers of 1024, as in nccl-tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace braid {

// The bytes `text` names, or nothing when it is not a size: empty, signed,
// with an unknown or a second suffix, or beyond what size_t holds.
inline std::optional<size_t> parseByteSize(std::string_view text) {
  size_t at = 0;
  uint64_t value = 0;
  for (; at < text.size() && text[at] >= '0' && text[at] <= '9'; ++at) {
    const uint64_t digit = static_cast<uint64_t>(text[at] - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  if (at == 0 || text.size() - at > 1) return std::nullopt;
  int shift = 0;
  if (at < text.size()) {
    switch (text[at]) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      default:
        return std::nullopt;
    }
  }
  if (value > (SIZE_MAX >> shift)) return std::nullopt;
  return static_cast<size_t>(value << shift);
}

}  // namespace braid
