#include "topology/topology_json.h"

#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>

#include "src/common/strcat.h"

namespace braid::topo {
namespace {

using json = nlohmann::ordered_json;

// Bounds every string of a description, so that even one with no devices
// and no cores left encodes within kMaxEncodedBytes (escaping at most
// triples a byte). BRAID_HOSTID has the same bound.
constexpr size_t kMaxString = 256;
constexpr size_t kMaxFileBytes = 64 << 20;

std::string hex(uint16_t value) {
  return strCat("0x", std::hex, std::setfill('0'), std::setw(4), value);
}

Status checkMembers(const json& object, std::string_view what,
                    std::initializer_list<std::string_view> known) {
  if (!object.is_object()) return invalidArgument(strCat(what, " is not a JSON object"));
  for (const auto& [key, value] : object.items()) {
    bool ok = false;
    for (std::string_view k : known) ok = ok || k == key;
    if (!ok) {
      std::string names;
      for (std::string_view k : known) names += strCat(names.empty() ? "" : ", ", k);
      return invalidArgument(strCat(what, ": unknown member '", key, "' (known: ", names, ")"));
    }
  }
  return Status::ok();
}

Status getString(const json& object, const char* key, std::string_view what, std::string* out) {
  auto it = object.find(key);
  if (it == object.end()) return Status::ok();
  if (!it->is_string() || it->get_ref<const std::string&>().size() > kMaxString)
    return invalidArgument(
        strCat(what, ": '", key, "' must be a string of at most ", kMaxString, " bytes"));
  *out = it->get<std::string>();
  return Status::ok();
}

Status getInt(const json& object, const char* key, std::string_view what, long lo, long hi,
              int* out) {
  auto it = object.find(key);
  if (it == object.end()) return Status::ok();
  bool ok = it->is_number_unsigned()  ? it->get<uint64_t>() <= static_cast<uint64_t>(hi)
            : it->is_number_integer() ? it->get<int64_t>() >= lo && it->get<int64_t>() <= hi
                                      : false;
  if (!ok)
    return invalidArgument(
        strCat(what, ": '", key, "' must be an integer in [", lo, ", ", hi, "]"));
  *out = static_cast<int>(it->get<int64_t>());
  return Status::ok();
}

// "0x10de", "10de" or 4318.
Status getPciId(const json& object, const char* key, std::string_view what, uint16_t* out) {
  auto it = object.find(key);
  if (it == object.end()) return Status::ok();
  auto bad = invalidArgument(strCat(what, ": '", key, "' must be a 16-bit PCI id like \"0x10de\""));
  if (it->is_number_unsigned()) {
    if (it->get<uint64_t>() > 0xffff) return bad;
    *out = static_cast<uint16_t>(it->get<uint64_t>());
    return Status::ok();
  }
  if (!it->is_string()) return bad;
  std::string text = it->get<std::string>();
  if (text.starts_with("0x") || text.starts_with("0X")) text = text.substr(2);
  if (text.empty() || text.size() > 4 ||
      text.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    return bad;
  *out = static_cast<uint16_t>(std::stoul(text, nullptr, 16));
  return Status::ok();
}

Status getNames(const json& object, const char* key, std::string_view what,
                std::vector<std::string>* out) {
  auto it = object.find(key);
  if (it == object.end()) return Status::ok();
  auto bad = invalidArgument(strCat(what, ": '", key, "' must be an array of non-empty strings"));
  if (!it->is_array() || it->size() > 256) return bad;
  out->clear();
  for (const auto& name : *it) {
    if (!name.is_string() || name.get_ref<const std::string&>().empty() ||
        name.get_ref<const std::string&>().size() > kMaxString)
      return bad;
    out->push_back(name.get<std::string>());
  }
  return Status::ok();
}

Result<PciDevice> deviceFromJson(const json& value, const std::string& what) {
  BRAID_RETURN_IF_ERROR(checkMembers(
      value, what, {"kind", "bus_id", "vendor", "device", "numa_node", "net", "ib", "uuid"}));
  PciDevice d;
  auto kind = value.find("kind");
  if (kind == value.end() || !kind->is_string())
    return invalidArgument(strCat(what, ": 'kind' (gpu, eth or ib) is required"));
  if (*kind == "gpu") {
    d.kind = DeviceKind::kGpu;
  } else if (*kind == "eth") {
    d.kind = DeviceKind::kEthernet;
  } else if (*kind == "ib") {
    d.kind = DeviceKind::kInfiniband;
  } else {
    return invalidArgument(
        strCat(what, ": kind '", kind->get<std::string>(), "' is not gpu, eth or ib"));
  }
  BRAID_RETURN_IF_ERROR(getString(value, "bus_id", what, &d.busId));
  BRAID_RETURN_IF_ERROR(getPciId(value, "vendor", what, &d.vendor));
  BRAID_RETURN_IF_ERROR(getPciId(value, "device", what, &d.device));
  BRAID_RETURN_IF_ERROR(getInt(value, "numa_node", what, -1, 1 << 20, &d.numaNode));
  BRAID_RETURN_IF_ERROR(getNames(value, "net", what, &d.netNames));
  BRAID_RETURN_IF_ERROR(getNames(value, "ib", what, &d.ibNames));
  BRAID_RETURN_IF_ERROR(getString(value, "uuid", what, &d.uuid));
  if (d.kind != DeviceKind::kGpu && !d.uuid.empty())
    return invalidArgument(strCat(what, ": 'uuid' is for GPUs"));
  // An InfiniBand card is usable through its verbs device; a file that names
  // none still means "this rank has InfiniBand".
  if (d.kind == DeviceKind::kInfiniband && d.ibNames.empty() && value.find("ib") == value.end())
    d.ibNames.push_back(d.busId.empty() ? "ib" : d.busId);
  if (d.busId.empty()) d.busId = "?";
  return d;
}

Result<RankTopology> rankFromJsonAt(const json& value, const std::string& what, int index) {
  BRAID_RETURN_IF_ERROR(checkMembers(
      value, what,
      {"rank", "hostname", "host_id", "pid", "numa_node", "cores", "devices", "transports"}));
  RankTopology r;
  int rank = index;
  BRAID_RETURN_IF_ERROR(getInt(value, "rank", what, 0, 1 << 30, &rank));
  if (index >= 0 && rank != index)
    return invalidArgument(strCat(what, ": 'rank' is ", rank, " at index ", index));
  BRAID_RETURN_IF_ERROR(getString(value, "hostname", what, &r.hostname));
  BRAID_RETURN_IF_ERROR(getString(value, "host_id", what, &r.hostId));
  if (r.hostname.empty() && r.hostId.empty())
    return invalidArgument(strCat(what, ": 'hostname' or 'host_id' is required"));
  if (r.hostId.empty()) r.hostId = r.hostname;
  BRAID_RETURN_IF_ERROR(getInt(value, "pid", what, 0, (1L << 31) - 1, &r.pid));
  BRAID_RETURN_IF_ERROR(getInt(value, "numa_node", what, -1, 1 << 20, &r.numaNode));
  if (auto cores = value.find("cores"); cores != value.end()) {
    if (cores->is_string()) {
      auto list = parseCpuList(cores->get<std::string>());
      if (!list.isOk()) return list.status().withContext(what);
      r.cores = std::move(list).value();
    } else if (cores->is_array()) {
      std::string text;
      for (const auto& c : *cores) {
        if (!c.is_number_unsigned())
          return invalidArgument(strCat(what, ": 'cores' must hold CPU numbers"));
        text += strCat(text.empty() ? "" : ",", c.get<uint64_t>());
      }
      auto list = parseCpuList(text);
      if (!list.isOk()) return list.status().withContext(what);
      r.cores = std::move(list).value();
    } else {
      return invalidArgument(
          strCat(what, ": 'cores' must be a cpu list like \"0-3,8\" or an array"));
    }
  }
  if (auto devices = value.find("devices"); devices != value.end()) {
    if (!devices->is_array() || devices->size() > 256)
      return invalidArgument(strCat(what, ": 'devices' must be an array (at most 256)"));
    for (size_t i = 0; i < devices->size(); ++i) {
      BRAID_ASSIGN_OR_RETURN(PciDevice d,
                             deviceFromJson((*devices)[i], strCat(what, ", device ", i)));
      r.devices.push_back(std::move(d));
    }
  }
  if (auto transports = value.find("transports"); transports != value.end()) {
    auto set = transportSetFromJsonValue(*transports);
    if (!set.isOk()) return set.status().withContext(what);
    r.transports = set.value();
  }
  return r;
}

std::string readAll(const std::string& path, Status* status) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *status = invalidArgument(strCat("BRAID_TOPO_FILE: cannot open '", path, "'"));
    return "";
  }
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxFileBytes) {
      *status = invalidArgument(strCat("BRAID_TOPO_FILE: '", path, "' is larger than 64 MiB"));
      return "";
    }
  }
  return text;
}

}  // namespace

json toJsonValue(const RankTopology& r) {
  json devices = json::array();
  for (const auto& d : r.devices) {
    json dev = {{"kind", deviceKindName(d.kind)},
                {"bus_id", d.busId},
                {"vendor", hex(d.vendor)},
                {"device", hex(d.device)},
                {"numa_node", d.numaNode}};
    // Always for NICs: a missing "ib" on an InfiniBand card means "has one".
    if (d.kind != DeviceKind::kGpu || !d.netNames.empty()) dev["net"] = d.netNames;
    if (d.kind != DeviceKind::kGpu || !d.ibNames.empty()) dev["ib"] = d.ibNames;
    if (!d.uuid.empty()) dev["uuid"] = d.uuid;
    devices.push_back(std::move(dev));
  }
  json out = {{"hostname", r.hostname},
              {"host_id", r.hostId},
              {"pid", r.pid},
              {"numa_node", r.numaNode},
              {"cores", formatCpuList(r.cores)},
              {"devices", std::move(devices)}};
  // Absent means unrestricted, the usual case.
  if (r.transports != TransportSet{}) out["transports"] = toJsonValue(r.transports);
  return out;
}

Result<RankTopology> rankFromJsonValue(const json& value) {
  try {
    return rankFromJsonAt(value, "topology", -1);
  } catch (const json::exception& e) {
    return invalidArgument(strCat("topology: ", e.what()));
  }
}

Result<TopologyFile> topologyFileFromJsonValue(const json& value) {
  try {
    TopologyFile file;
    const json* list = &value;
    if (value.is_object() && value.contains("ranks")) {
      list = &value.at("ranks");
      if (!list->is_array()) return invalidArgument("'ranks' is not an array");
    }
    if (list->is_array()) {
      if (list->empty()) return invalidArgument("no rank descriptions");
      for (size_t i = 0; i < list->size(); ++i) {
        BRAID_ASSIGN_OR_RETURN(RankTopology r,
                               rankFromJsonAt((*list)[i], strCat("rank ", i), static_cast<int>(i)));
        file.ranks.push_back(std::move(r));
      }
      return file;
    }
    if (!value.is_object())
      return invalidArgument("expected an array of rank descriptions or one description");
    BRAID_ASSIGN_OR_RETURN(RankTopology r, rankFromJsonAt(value, "topology", -1));
    file.ranks.push_back(std::move(r));
    file.shared = true;
    return file;
  } catch (const json::exception& e) {
    return invalidArgument(e.what());
  }
}

json toJsonValue(const TransportSet& set) {
  json names = json::array();
  if (set.cudaIpc) names.push_back("cuda_ipc");
  if (set.shm) names.push_back("shm");
  if (set.ib) names.push_back("ib");
  names.push_back("tcp");
  return names;
}

Result<TransportSet> transportSetFromJsonValue(const json& value) {
  auto bad = invalidArgument("'transports' must be an array of names among cuda_ipc, shm, ib, tcp");
  if (!value.is_array()) return bad;
  TransportSet set{false, false, false};
  for (const auto& name : value) {
    if (!name.is_string()) return bad;
    auto t = parseTransport(name.get<std::string>());
    if (!t.isOk()) return bad;
    set.cudaIpc = set.cudaIpc || t.value() == Transport::kCudaIpc;
    set.shm = set.shm || t.value() == Transport::kShm;
    set.ib = set.ib || t.value() == Transport::kIb;
  }
  return set;
}

json toJsonValue(const TransportMatrix& matrix) {
  json transports = json::array(), links = json::array();
  for (int a = 0; a < matrix.size(); ++a) {
    json t = json::array(), l = json::array();
    for (int b = 0; b < matrix.size(); ++b) {
      t.push_back(transportName(matrix.at(a, b).transport));
      l.push_back(linkKindName(matrix.at(a, b).kind));
    }
    transports.push_back(std::move(t));
    links.push_back(std::move(l));
  }
  return {{"transport", std::move(transports)}, {"link", std::move(links)}};
}

std::string toJson(const RankTopology& rank, int indent) {
  return toJsonValue(rank).dump(indent);
}

Result<RankTopology> rankFromJson(std::string_view text) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return invalidArgument("topology: not valid JSON");
  return rankFromJsonValue(value);
}

std::string TransportMatrix::toJson(int indent) const {
  return toJsonValue(*this).dump(indent);
}

Result<TopologyFile> parseTopologyJson(std::string_view text) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return invalidArgument("not valid JSON");
  return topologyFileFromJsonValue(value);
}

Result<TopologyFile> loadTopologyFile(const std::string& path) {
  Status status;
  std::string text = readAll(path, &status);
  if (!status.isOk()) return status;
  auto file = parseTopologyJson(text);
  if (!file.isOk()) return file.status().withContext(strCat("BRAID_TOPO_FILE '", path, "'"));
  return file;
}

Result<RankTopology> TopologyFile::entry(int rank, int numRanks) const {
  if (shared) return ranks.at(0);
  if (numRanks > 0 && static_cast<size_t>(numRanks) != ranks.size())
    return invalidArgument(
        strCat("BRAID_TOPO_FILE lists ", ranks.size(), " ranks; the communicator has ", numRanks));
  if (rank < 0 || static_cast<size_t>(rank) >= ranks.size())
    return invalidArgument(
        strCat("BRAID_TOPO_FILE lists ", ranks.size(), " ranks; there is no rank ", rank));
  return ranks[rank];
}

}  // namespace braid::topo
