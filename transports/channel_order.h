// The order of the messages of one channel. A channel (a tag's top byte)
// numbers its messages in the tag's other 56 bits, and those numbers wrap:
// a stream's collective calls take theirs from a 32-bit call number
// (src/call_tags.h). So the order is circular: of two tags of one channel,
// `a` comes before `b` when b is ahead of a by less than half of the 2^56
// numbers. Two ranks' calls are never that far apart.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

namespace braid::transport {

inline constexpr uint64_t kChannelTagNumbers = uint64_t{1} << 56;

inline uint8_t channelOf(uint64_t tag) {
  return static_cast<uint8_t>(tag >> 56);
}

// Whether `a` comes before `b`, two tags of one channel.
inline bool tagBefore(uint64_t a, uint64_t b) {
  const uint64_t ahead = (b - a) & (kChannelTagNumbers - 1);
  return ahead != 0 && ahead < kChannelTagNumbers / 2;
}

// The latest tag that arrived in each channel of a connection. One left
// more than half the circle behind would read as ahead: its owner forgets
// it in time (forgetBefore, from Connection::forgetArrivalsBefore).
class LatestArrivals {
 public:
  void forgetBefore(uint64_t tag) {
    Latest& l = latest_[channelOf(tag)];
    if (l.any && tagBefore(l.tag, tag)) l = {};
  }
  void arrived(uint64_t tag) {
    Latest& l = latest_[channelOf(tag)];
    if (!l.any || tagBefore(l.tag, tag)) l = {true, tag};
  }
  // The latest arrival of tag's channel where it comes after `tag` (the
  // peer moved past it), else nothing.
  std::optional<uint64_t> after(uint64_t tag) const {
    const Latest& l = latest_[channelOf(tag)];
    if (l.any && tagBefore(tag, l.tag)) return l.tag;
    return std::nullopt;
  }

 private:
  struct Latest {
    bool any = false;
    uint64_t tag = 0;
  };
  std::array<Latest, 256> latest_{};
};

// Calls visit(first, last) for the one or two ranges of tag values, each
// inclusive and in key order, that hold the tags of tag's channel coming
// before `tag`: a map keyed by tag finds them with lower_bound.
template <typename Visit>
void rangesBefore(uint64_t tag, Visit visit) {
  constexpr uint64_t kNumbers = kChannelTagNumbers - 1, kHalf = kChannelTagNumbers / 2;
  const uint64_t base = tag & ~kNumbers, number = tag & kNumbers;
  if (number >= kHalf) {
    visit(base + (number - kHalf) + 1, tag - 1);
    return;
  }
  if (number > 0) visit(base, tag - 1);
  if (number + kHalf + 1 <= kNumbers) visit(base + number + kHalf + 1, base + kNumbers);
}

// The first entry of `byTag` (a map keyed by tag value) whose tag comes
// before `bound` in bound's channel, or byTag.end().
template <typename Map>
auto firstBefore(Map& byTag, uint64_t bound) {
  auto found = byTag.end();
  rangesBefore(bound, [&](uint64_t first, uint64_t last) {
    if (found != byTag.end()) return;
    auto it = byTag.lower_bound(first);
    if (it != byTag.end() && it->first <= last) found = it;
  });
  return found;
}

}  // namespace braid::transport
