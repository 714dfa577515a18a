#include "transports/ib/port_choice.h"

#include <cstdlib>

#include "src/common/strcat.h"

namespace braid::ib {

namespace {

bool isIpv4Mapped(const Gid& gid) {
  for (int i = 0; i < 10; ++i)
    if (gid.raw[i] != 0) return false;
  return gid.raw[10] == 0xff && gid.raw[11] == 0xff;
}

}  // namespace

bool HcaFilter::allows(const std::string& device, int port) const {
  if (entries.empty()) return true;
  bool listed = false;
  for (const Entry& e : entries) {
    const bool nameMatches = e.exact ? device == e.name : device.rfind(e.name, 0) == 0;
    if (nameMatches && (e.port == 0 || e.port == port)) listed = true;
  }
  return listed != exclude;
}

Result<HcaFilter> parseHcaFilter(const std::string& text) {
  HcaFilter filter;
  std::string rest = text;
  if (!rest.empty() && rest[0] == '^') {
    filter.exclude = true;
    rest.erase(0, 1);
    if (rest.empty()) return invalidArgument("BRAID_IB_HCA='^' names no device to leave out");
  }
  size_t pos = 0;
  while (!rest.empty() && pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    std::string item =
        rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? rest.size() + 1 : comma + 1;
    HcaFilter::Entry e;
    if (!item.empty() && item[0] == '=') {
      e.exact = true;
      item.erase(0, 1);
    }
    if (size_t colon = item.find(':'); colon != std::string::npos) {
      const std::string port = item.substr(colon + 1);
      char* end = nullptr;
      const long n = std::strtol(port.c_str(), &end, 10);
      if (port.empty() || *end != '\0' || n < 1 || n > 255)
        return invalidArgument(
            strCat("BRAID_IB_HCA='", text, "': port '", port, "' is not a number from 1 to 255"));
      e.port = static_cast<int>(n);
      item.resize(colon);
    }
    if (item.empty())
      return invalidArgument(strCat("BRAID_IB_HCA='", text, "': an entry has no device name"));
    e.name = item;
    filter.entries.push_back(std::move(e));
  }
  return filter;
}

Result<PortChoice> choosePort(const RdmaProbe& probe, const HcaFilter& filter,
                              const std::vector<std::string>& nearFirst) {
  for (const std::string& near : nearFirst)
    for (const RdmaDevice& d : probe.devices)
      if (d.name == near)
        for (const RdmaPort& p : d.ports)
          if (p.active() && filter.allows(d.name, p.number)) return PortChoice{d.name, p.number};
  std::string seen;
  for (const RdmaDevice& d : probe.devices)
    for (const RdmaPort& p : d.ports) {
      const bool allowed = filter.allows(d.name, p.number);
      if (allowed && p.active()) return PortChoice{d.name, p.number};
      seen += strCat(seen.empty() ? "" : ", ", d.name, ":", p.number, " ", p.state,
                     allowed ? "" : " (excluded by BRAID_IB_HCA)");
    }
  if (seen.empty())
    return notSupported(
        strCat("no RDMA device", probe.unavailable.empty() ? "" : ": " + probe.unavailable));
  return notSupported(strCat("no active RDMA port allowed: ", seen));
}

Result<int> chooseGidIndex(Device& device, uint8_t port, int forced) {
  BRAID_ASSIGN_OR_RETURN(PortInfo info, device.queryPort(port));
  if (info.linkLayer == LinkLayer::kInfiniBand) return 0;
  if (forced >= 0) {
    if (forced >= info.gidTableLength)
      return invalidArgument(strCat("BRAID_IB_GID_INDEX=", forced, ": ", device.name(), " port ",
                                    int{port}, " has ", info.gidTableLength, " GIDs"));
    BRAID_ASSIGN_OR_RETURN(Gid gid, device.queryGid(port, forced));
    if (gid.isZero())
      return invalidArgument(strCat("BRAID_IB_GID_INDEX=", forced, ": GID ", forced, " of ",
                                    device.name(), " port ", int{port}, " is empty"));
    return forced;
  }
  int firstNonZero = -1;
  for (int i = 0; i < info.gidTableLength; ++i) {
    auto gid = device.queryGid(port, i);
    if (!gid.isOk() || gid->isZero()) continue;
    if (isIpv4Mapped(*gid)) return i;
    if (firstNonZero < 0) firstNonZero = i;
  }
  if (firstNonZero >= 0) return firstNonZero;
  return notSupported(strCat(device.name(), " port ", int{port},
                             " has no GID (no IP address on its network interface?)"));
}

}  // namespace braid::ib
