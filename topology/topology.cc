#include "topology/topology.h"

#include <unistd.h>

#include <fstream>
#include <functional>
#include <sstream>

namespace braid::topo {

std::string PeerInfo::encode() const {
  std::ostringstream out;
  out << hostId << ' ' << pid << ' ' << hostname;
  return out.str();
}

bool PeerInfo::decode(std::string_view text, PeerInfo* out) {
  std::istringstream in{std::string(text)};
  PeerInfo p;
  if (!(in >> p.hostId >> p.pid)) return false;
  in.get();
  std::getline(in, p.hostname);
  *out = p;
  return true;
}

std::string_view linkKindName(LinkKind kind) {
  switch (kind) {
    case LinkKind::kSelf:
      return "self";
    case LinkKind::kSameHost:
      return "same-host";
    case LinkKind::kNetwork:
      return "network";
  }
  return "?";
}

PeerInfo detectLocal() {
  PeerInfo p;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  p.hostname = host;
  p.pid = static_cast<int>(getpid());
  // Containers may share a hostname across machines; the boot id does not.
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  p.hostId = std::hash<std::string>{}(p.hostname + "/" + boot);
  return p;
}

LinkKind classify(const std::vector<PeerInfo>& peers, int a, int b) {
  if (a == b) return LinkKind::kSelf;
  return peers[a].hostId == peers[b].hostId ? LinkKind::kSameHost : LinkKind::kNetwork;
}

}  // namespace braid::topo
