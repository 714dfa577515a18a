#include "topology/topology.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <map>
#include <optional>
#include <set>

#include "src/common/log.h"
#include "src/common/strcat.h"

namespace braid::topo {
namespace {

// Bounds that keep a hostile or corrupt description from costing more than
// a genuine one could.
constexpr int kMaxCpu = (1 << 20) - 1;
constexpr size_t kMaxCpuCount = 1 << 16;
constexpr int kMaxDevices = 256;
constexpr std::string_view kVersionTag = "T2";
constexpr std::string_view kEmpty = "~";

bool plainChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '@' || c == '=' || c == '/' || c == '-';
}

// Percent-escapes everything but plainChar, so a field never contains the
// separators (space, ',', '+') and "~" can stand for the empty string.
std::string escape(std::string_view text) {
  if (text.empty()) return std::string(kEmpty);
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (plainChar(c)) {
      out += c;
    } else {
      auto byte = static_cast<unsigned char>(c);
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  }
  return out;
}

int hexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> unescape(std::string_view text) {
  if (text == kEmpty) return std::string();
  if (text.empty()) return std::nullopt;
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (plainChar(c)) {
      out += c;
      continue;
    }
    if (c != '%' || i + 2 >= text.size() || hexDigit(text[i + 1]) < 0 || hexDigit(text[i + 2]) < 0)
      return std::nullopt;
    out += static_cast<char>(hexDigit(text[i + 1]) * 16 + hexDigit(text[i + 2]));
    i += 2;
  }
  return out;
}

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t pos = 0;
  while (true) {
    size_t next = text.find(sep, pos);
    parts.push_back(text.substr(pos, next == std::string_view::npos ? next : next - pos));
    if (next == std::string_view::npos) return parts;
    pos = next + 1;
  }
}

template <typename T>
std::optional<T> parseInt(std::string_view text, int base = 10) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value, base);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

std::string hex4(uint16_t value) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(4, '0');
  for (int i = 3; i >= 0; --i, value >>= 4) out[i] = kHex[value & 15];
  return out;
}

std::string encodeNames(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) {
    if (name.empty()) continue;
    if (!out.empty()) out += '+';
    out += escape(name);
  }
  return out.empty() ? std::string(kEmpty) : out;
}

std::optional<std::vector<std::string>> decodeNames(std::string_view text) {
  std::vector<std::string> names;
  if (text == kEmpty) return names;
  for (std::string_view part : split(text, '+')) {
    auto name = unescape(part);
    if (!name || name->empty()) return std::nullopt;
    names.push_back(std::move(*name));
  }
  return names;
}

char deviceLetter(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kGpu:
      return 'g';
    case DeviceKind::kEthernet:
      return 'e';
    case DeviceKind::kInfiniband:
      return 'i';
  }
  return '?';
}

std::string encodeDevice(const PciDevice& d) {
  return strCat(deviceLetter(d.kind), ',', escape(d.busId), ',', hex4(d.vendor), ',',
                hex4(d.device), ',', d.numaNode, ',', encodeNames(d.netNames), ',',
                encodeNames(d.ibNames), ',', d.uuid.empty() ? std::string(kEmpty) : escape(d.uuid));
}

Result<PciDevice> decodeDevice(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return invalidArgument(strCat("malformed device '", text.substr(0, 64), "': ", why));
  };
  std::vector<std::string_view> f = split(text, ',');
  if (f.size() != 8) return bad("expected 8 fields");
  PciDevice d;
  if (f[0] == "g") {
    d.kind = DeviceKind::kGpu;
  } else if (f[0] == "e") {
    d.kind = DeviceKind::kEthernet;
  } else if (f[0] == "i") {
    d.kind = DeviceKind::kInfiniband;
  } else {
    return bad("unknown kind");
  }
  auto bus = unescape(f[1]);
  auto vendor = f[2].size() <= 4 ? parseInt<uint16_t>(f[2], 16) : std::nullopt;
  auto device = f[3].size() <= 4 ? parseInt<uint16_t>(f[3], 16) : std::nullopt;
  auto numa = parseInt<int>(f[4]);
  auto net = decodeNames(f[5]);
  auto ib = decodeNames(f[6]);
  auto uuid = f[7] == kEmpty ? std::optional<std::string>("") : unescape(f[7]);
  if (!bus || bus->empty()) return bad("bus id");
  if (!vendor || !device) return bad("PCI id");
  if (!numa || *numa < -1) return bad("NUMA node");
  if (!net || !ib) return bad("names");
  if (!uuid || (!uuid->empty() && d.kind != DeviceKind::kGpu)) return bad("UUID");
  d.busId = std::move(*bus);
  d.vendor = *vendor;
  d.device = *device;
  d.numaNode = *numa;
  d.netNames = std::move(*net);
  d.ibNames = std::move(*ib);
  d.uuid = std::move(*uuid);
  return d;
}

std::string encodeWith(const RankTopology& r, size_t numDevices, bool withCores) {
  int set = (r.transports.cudaIpc ? 1 : 0) | (r.transports.shm ? 2 : 0) | (r.transports.ib ? 4 : 0);
  std::string out = strCat(
      kVersionTag, ' ', escape(r.hostname), ' ', escape(r.hostId), ' ', r.pid, ' ', r.numaNode, ' ',
      withCores && !r.cores.empty() ? formatCpuList(r.cores) : kEmpty, ' ', set, ' ', numDevices);
  for (size_t i = 0; i < numDevices; ++i) {
    out += ' ';
    out += encodeDevice(r.devices[i]);
  }
  return out;
}

}  // namespace

std::string nvidiaGpuUuid(std::string_view information) {
  constexpr std::string_view kLabel = "GPU UUID:";
  for (std::string_view line : split(information, '\n')) {
    if (!line.starts_with(kLabel)) continue;
    line.remove_prefix(kLabel.size());
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string_view::npos) return "";
    line.remove_prefix(first);
    line = line.substr(0, line.find_last_not_of(" \t\r") + 1);
    // One word: the driver prints "GPU-" and the UUID's hex groups.
    if (line.find_first_of(" \t") != std::string_view::npos) return "";
    return std::string(line);
  }
  return "";
}

int deviceOrder(const PciDevice& d) {
  if (d.kind == DeviceKind::kGpu) return 0;
  if (d.kind == DeviceKind::kInfiniband || !d.ibNames.empty()) return 1;
  return 2;
}

std::optional<DeviceKind> pciDeviceKind(uint32_t classCode, uint16_t vendor) {
  // Display controllers (class 0x03) of other makers are a BMC's or a
  // hypervisor's VGA: no CUDA, ROCm or Level Zero device behind them.
  constexpr uint16_t kAmdVendor = 0x1002, kIntelVendor = 0x8086;
  if ((classCode >> 16) == 0x03)
    return vendor == kNvidiaVendor || vendor == kAmdVendor || vendor == kIntelVendor
               ? std::optional(DeviceKind::kGpu)
               : std::nullopt;
  if ((classCode >> 8) == 0x0200) return DeviceKind::kEthernet;
  if ((classCode >> 8) == 0x0207) return DeviceKind::kInfiniband;
  return std::nullopt;
}

std::string_view deviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kGpu:
      return "gpu";
    case DeviceKind::kEthernet:
      return "eth";
    case DeviceKind::kInfiniband:
      return "ib";
  }
  return "?";
}

int RankTopology::nvidiaGpuCount() const {
  return static_cast<int>(std::count_if(devices.begin(), devices.end(), [](const PciDevice& d) {
    return d.kind == DeviceKind::kGpu && d.vendor == kNvidiaVendor;
  }));
}

bool RankTopology::hasIbDevice() const {
  return std::any_of(devices.begin(), devices.end(),
                     [](const PciDevice& d) { return !d.ibNames.empty(); });
}

std::string RankTopology::encode() const {
  if (devices.size() <= static_cast<size_t>(kMaxDevices)) {
    std::string out = encodeWith(*this, devices.size(), true);
    if (out.size() <= kMaxEncodedBytes) return out;
  }
  // Too long: drop devices from the least important end.
  RankTopology sorted = *this;
  std::stable_sort(
      sorted.devices.begin(), sorted.devices.end(),
      [](const PciDevice& x, const PciDevice& y) { return deviceOrder(x) < deviceOrder(y); });
  size_t n = std::min<size_t>(sorted.devices.size(), kMaxDevices);
  std::string out = encodeWith(sorted, n, true);
  while (out.size() > kMaxEncodedBytes && n > 0) out = encodeWith(sorted, --n, true);
  bool withCores = out.size() <= kMaxEncodedBytes;
  if (!withCores) out = encodeWith(sorted, 0, false);
  BRAID_WARN("topology description of ", hostname, " too long: ", sorted.devices.size() - n, " of ",
             sorted.devices.size(), " devices left out", withCores ? "" : ", and the cores");
  return out;
}

Result<RankTopology> RankTopology::decode(std::string_view text) {
  while (!text.empty() && text.back() == '\0') text.remove_suffix(1);
  auto bad = [](std::string_view why) {
    return invalidArgument(strCat("malformed topology description: ", why));
  };
  if (text.size() > 2 * kMaxEncodedBytes) return bad("too long");
  std::vector<std::string_view> t = split(text, ' ');
  if (t.empty() || t[0] != kVersionTag)
    return bad(strCat("does not start with '", kVersionTag, "' (another braid version?)"));
  if (t.size() < 8) return bad("too few fields");
  RankTopology r;
  auto host = unescape(t[1]);
  auto hostId = unescape(t[2]);
  auto pid = parseInt<int>(t[3]);
  auto numa = parseInt<int>(t[4]);
  auto set = parseInt<int>(t[6]);
  auto numDevices = parseInt<int>(t[7]);
  if (!host || !hostId) return bad("host name or id");
  if (!pid || *pid < 0) return bad("pid");
  if (!numa || *numa < -1) return bad("NUMA node");
  if (!set || *set < 0 || *set > 7) return bad("transport set");
  if (!numDevices || *numDevices < 0 || *numDevices > kMaxDevices) return bad("device count");
  if (t.size() != 8 + static_cast<size_t>(*numDevices))
    return bad("device count and fields differ");
  if (t[5] != kEmpty) {
    BRAID_ASSIGN_OR_RETURN(r.cores, parseCpuList(t[5]));
  }
  r.hostname = std::move(*host);
  r.hostId = std::move(*hostId);
  r.pid = *pid;
  r.numaNode = *numa;
  r.transports = {(*set & 1) != 0, (*set & 2) != 0, (*set & 4) != 0};
  for (int i = 0; i < *numDevices; ++i) {
    BRAID_ASSIGN_OR_RETURN(PciDevice d, decodeDevice(t[8 + i]));
    r.devices.push_back(std::move(d));
  }
  return r;
}

std::string RankTopology::summary() const {
  std::map<std::string_view, int> counts;
  for (const auto& d : devices) ++counts[deviceKindName(d.kind)];
  std::string devs;
  for (const auto& [kind, count] : counts)
    devs += strCat(devs.empty() ? "" : ", ", count, ' ', kind);
  return strCat("host ", hostname, " (id ", hostId, "), pid ", pid, ", NUMA node ",
                numaNode < 0 ? std::string("?") : std::to_string(numaNode), ", cores ",
                cores.empty() ? std::string("?") : formatCpuList(cores),
                ", devices: ", devs.empty() ? std::string("none") : devs);
}

std::string formatCpuList(std::span<const int> cpus) {
  std::vector<int> sorted(cpus.begin(), cpus.end());
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(sorted[i]);
    if (j > i) out += strCat('-', sorted[j]);
    i = j + 1;
  }
  return out;
}

Result<std::vector<int>> parseCpuList(std::string_view text) {
  auto bad = [&]() {
    return invalidArgument(strCat("malformed cpu list '", text.substr(0, 64), "'"));
  };
  std::vector<int> cpus;
  // The kernel ends its files with a newline.
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text.empty()) return cpus;
  for (std::string_view item : split(text, ',')) {
    size_t dash = item.find('-');
    auto lo = parseInt<int>(item.substr(0, dash));
    auto hi = dash == std::string_view::npos ? lo : parseInt<int>(item.substr(dash + 1));
    if (!lo || !hi || *lo < 0 || *hi < *lo || *hi > kMaxCpu) return bad();
    if (cpus.size() + static_cast<size_t>(*hi - *lo + 1) > kMaxCpuCount) return bad();
    for (int c = *lo; c <= *hi; ++c) cpus.push_back(c);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

Result<RankTopology> localTopology(const Config& config, int rank, int numRanks) {
  if (!config.topoFile.empty()) {
    BRAID_ASSIGN_OR_RETURN(TopologyFile file, loadTopologyFile(config.topoFile));
    return file.entry(rank, numRanks);
  }
  return detect({.hostId = config.hostId});
}

std::string_view linkKindName(LinkKind kind) {
  switch (kind) {
    case LinkKind::kSelf:
      return "self";
    case LinkKind::kSameNuma:
      return "same-numa";
    case LinkKind::kCrossNuma:
      return "cross-numa";
    case LinkKind::kSameHost:
      return "same-host";
    case LinkKind::kNetwork:
      return "network";
  }
  return "?";
}

bool isSameHost(LinkKind kind) {
  return kind == LinkKind::kSameNuma || kind == LinkKind::kCrossNuma || kind == LinkKind::kSameHost;
}

LinkKind classify(std::span<const RankTopology> ranks, int a, int b) {
  if (a == b) return LinkKind::kSelf;
  const RankTopology& x = ranks[a];
  const RankTopology& y = ranks[b];
  if (x.hostId != y.hostId) return LinkKind::kNetwork;
  if (x.numaNode < 0 || y.numaNode < 0) return LinkKind::kSameHost;
  return x.numaNode == y.numaNode ? LinkKind::kSameNuma : LinkKind::kCrossNuma;
}

std::string_view transportName(Transport transport) {
  switch (transport) {
    case Transport::kSelf:
      return "self";
    case Transport::kCudaIpc:
      return "cuda_ipc";
    case Transport::kShm:
      return "shm";
    case Transport::kIb:
      return "ib";
    case Transport::kTcp:
      return "tcp";
  }
  return "?";
}

namespace {

constexpr std::array kPriority = {Transport::kCudaIpc, Transport::kShm, Transport::kIb,
                                  Transport::kTcp};

bool allows(const TransportSet& set, Transport t) {
  switch (t) {
    case Transport::kCudaIpc:
      return set.cudaIpc;
    case Transport::kShm:
      return set.shm;
    case Transport::kIb:
      return set.ib;
    default:
      return true;
  }
}

// Why `t` cannot serve (a, b); "" when it can.
std::string unreachable(std::span<const RankTopology> ranks, int a, int b, LinkKind kind,
                        const TransportSet& available, Transport t) {
  std::string_view name = transportName(t);
  if (!allows(available, t)) return strCat(name, " is not available in this build");
  for (int r : {a, b}) {
    if (!allows(ranks[r].transports, t)) return strCat("rank ", r, " cannot use ", name);
  }
  switch (t) {
    case Transport::kCudaIpc:
    case Transport::kShm:
      if (!isSameHost(kind))
        return strCat(name, " needs both ranks on one host; they are on ", ranks[a].hostname,
                      " (id ", ranks[a].hostId, ") and ", ranks[b].hostname, " (id ",
                      ranks[b].hostId, ")");
      if (t == Transport::kCudaIpc) {
        for (int r : {a, b}) {
          if (!ranks[r].hasNvidiaGpu()) return strCat("rank ", r, " has no NVIDIA GPU");
        }
      }
      return "";
    case Transport::kIb:
      for (int r : {a, b}) {
        if (!ranks[r].hasIbDevice()) return strCat("rank ", r, " has no InfiniBand or RoCE device");
      }
      return "";
    default:
      return "";
  }
}

}  // namespace

Result<Transport> parseTransport(std::string_view name) {
  std::string known;
  for (Transport t : kPriority) {
    if (transportName(t) == name) return t;
    known += strCat(known.empty() ? "" : ", ", transportName(t));
  }
  return invalidArgument(strCat("unknown transport '", name, "' (known: ", known, ")"));
}

std::vector<HostShare> hostShares(std::span<const RankTopology> ranks) {
  std::map<std::string_view, int> ranksOf;
  std::map<std::string_view, std::set<int>> coresOf;
  std::map<std::string_view, int> gpusOf;
  for (const RankTopology& r : ranks) {
    ++ranksOf[r.hostId];
    coresOf[r.hostId].insert(r.cores.begin(), r.cores.end());
    gpusOf[r.hostId] = std::max(gpusOf[r.hostId], r.nvidiaGpuCount());
  }
  std::vector<HostShare> out;
  out.reserve(ranks.size());
  for (const RankTopology& r : ranks)
    out.push_back(
        {ranksOf[r.hostId], static_cast<int>(coresOf[r.hostId].size()), gpusOf[r.hostId]});
  return out;
}

Result<Link> chooseLink(std::span<const RankTopology> ranks, int a, int b,
                        const TransportSet& available, std::string_view forced) {
  int n = static_cast<int>(ranks.size());
  if (a < 0 || b < 0 || a >= n || b >= n)
    return invalidArgument(strCat("pair (", a, ", ", b, ") outside ", n, " ranks"));
  Link link;
  link.kind = classify(ranks, a, b);
  if (a == b) return link;
  if (!forced.empty()) {
    auto parsed = parseTransport(forced);
    if (!parsed.isOk()) return parsed.status().withContext("BRAID_TRANSPORT");
    Transport t = parsed.value();
    std::string why = unreachable(ranks, a, b, link.kind, available, t);
    if (!why.empty())
      return invalidArgument(
          strCat("BRAID_TRANSPORT=", forced, " cannot connect ranks ", a, " and ", b, ": ", why));
    link.transport = t;
    return link;
  }
  for (Transport t : kPriority) {
    if (unreachable(ranks, a, b, link.kind, available, t).empty()) {
      link.transport = t;
      return link;
    }
  }
  return internalError("tcp reaches every pair");
}

Result<TransportMatrix> chooseTransports(std::span<const RankTopology> ranks,
                                         const TransportSet& available, std::string_view forced) {
  int n = static_cast<int>(ranks.size());
  // Checked before any pair, so that a single rank rejects a bad name too.
  if (!forced.empty()) {
    if (auto t = parseTransport(forced); !t.isOk())
      return t.status().withContext("BRAID_TRANSPORT");
  }
  TransportMatrix matrix(n);
  for (int a = 0; a < n; ++a) {
    // (a, b) and (b, a) are computed alike; computing one half keeps it so.
    for (int b = a; b < n; ++b) {
      BRAID_ASSIGN_OR_RETURN(Link link, chooseLink(ranks, a, b, available, forced));
      matrix.at(a, b) = link;
      matrix.at(b, a) = link;
    }
  }
  return matrix;
}

std::string TransportMatrix::toText() const {
  // Full names up to 16 ranks; one letter per cell beyond, so a row still
  // fits a terminal at a few hundred ranks.
  bool compact = numRanks_ > 16;
  auto transportCell = [&](Transport t) -> std::string {
    if (!compact) return std::string(transportName(t));
    return t == Transport::kSelf ? "." : std::string(1, transportName(t)[0]);
  };
  auto kindCell = [&](LinkKind k) -> std::string {
    if (!compact) return std::string(linkKindName(k));
    static constexpr char kLetters[] = ".NXHR";
    return std::string(1, kLetters[static_cast<int>(k)]);
  };
  std::string out;
  auto grid = [&](std::string_view title, auto cell) {
    size_t width = std::to_string(numRanks_).size();
    for (int a = 0; a < numRanks_; ++a)
      for (int b = 0; b < numRanks_; ++b) width = std::max(width, cell(at(a, b)).size());
    auto pad = [](std::string s, size_t w) {
      return std::string(w - std::min(w, s.size()), ' ') + s;
    };
    size_t label = std::to_string(numRanks_).size();
    out += strCat(title, " (row: rank a, column: rank b)\n", std::string(label, ' '));
    for (int b = 0; b < numRanks_; ++b) out += ' ' + pad(std::to_string(b), width);
    out += '\n';
    for (int a = 0; a < numRanks_; ++a) {
      out += pad(std::to_string(a), label);
      for (int b = 0; b < numRanks_; ++b) out += ' ' + pad(cell(at(a, b)), width);
      out += '\n';
    }
  };
  grid("transport", [&](const Link& l) { return transportCell(l.transport); });
  if (compact) out += "  (. self, c cuda_ipc, s shm, i ib, t tcp)\n";
  out += '\n';
  grid("link", [&](const Link& l) { return kindCell(l.kind); });
  if (compact) out += "  (. self, N same-numa, X cross-numa, H same-host, R network)\n";
  std::map<Transport, size_t> pairs;
  for (int a = 0; a < numRanks_; ++a)
    for (int b = a + 1; b < numRanks_; ++b) ++pairs[at(a, b).transport];
  out += "\npairs:";
  if (pairs.empty()) out += " none";
  for (const auto& [t, count] : pairs) out += strCat(' ', transportName(t), ' ', count);
  out += '\n';
  return out;
}

}  // namespace braid::topo
