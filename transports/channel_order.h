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

// The latest tag that arrived in each channel of a connection.
class LatestArrivals {
 public:
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

// The first entry of `byTag` (a map keyed by tag value) in `channel` whose
// tag comes before `bound`, or byTag.end().
template <typename Map>
auto firstBefore(Map& byTag, uint8_t channel, uint64_t bound) {
  const uint64_t base = uint64_t{channel} << 56;
  for (auto it = byTag.lower_bound(base); it != byTag.end() && channelOf(it->first) == channel;
       ++it)
    if (tagBefore(it->first, bound)) return it;
  return byTag.end();
}

}  // namespace braid::transport
