// Where ranks are relative to each other. Each rank describes itself with a
// PeerInfo; the table of all PeerInfos (exchanged at init) decides the link
// class of every pair, which in turn picks the transport serving it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace braid::topo {

struct PeerInfo {
  std::string hostname;
  uint64_t hostId = 0;  // equal for processes on one machine (boot id + hostname)
  int pid = 0;

  std::string encode() const;
  static bool decode(std::string_view text, PeerInfo* out);
};

enum class LinkKind { kSelf, kSameHost, kNetwork };
std::string_view linkKindName(LinkKind kind);

PeerInfo detectLocal();
LinkKind classify(const std::vector<PeerInfo>& peers, int a, int b);

}  // namespace braid::topo
