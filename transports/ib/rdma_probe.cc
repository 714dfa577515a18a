#include "transports/ib/rdma_probe.h"

#include <cerrno>
#include <cstring>
#include <memory>

#include "src/common/strcat.h"
#if BRAID_IB_VERBS
#include "transports/ib/verbs_library.h"
#endif

namespace braid::ib {

#if BRAID_IB_VERBS
namespace {

std::string portStateName(ibv_port_state state) {
  switch (state) {
    case IBV_PORT_DOWN:
      return "down";
    case IBV_PORT_INIT:
      return "init";
    case IBV_PORT_ARMED:
      return "armed";
    case IBV_PORT_ACTIVE:
      return "active";
    case IBV_PORT_ACTIVE_DEFER:
      return "active_defer";
    default:
      return strCat("state ", static_cast<int>(state));
  }
}

// One device's ports; a device that cannot be opened or queried is listed
// without ports and the reason goes to `problems`.
RdmaDevice queryDevice(const VerbsLibrary& lib, ibv_device* device, std::string* problems) {
  RdmaDevice out;
  const char* name = lib.getDeviceName(device);
  out.name = name ? name : "?";
  auto closer = [&lib](ibv_context* c) { lib.closeDevice(c); };
  std::unique_ptr<ibv_context, decltype(closer)> context(lib.openDevice(device), closer);
  if (!context) {
    *problems += strCat("; ", out.name, ": cannot open (", std::strerror(errno), ")");
    return out;
  }
  ibv_device_attr attr{};
  if (int rc = lib.queryDevice(context.get(), &attr); rc != 0) {
    *problems += strCat("; ", out.name, ": query failed (", std::strerror(rc), ")");
    return out;
  }
  for (int p = 1; p <= attr.phys_port_cnt; ++p) {
    ibv_port_attr port{};
    if (lib.queryPort(context.get(), static_cast<uint8_t>(p), &port) != 0) continue;
    RdmaPort info;
    info.number = p;
    info.state = portStateName(port.state);
    info.linkLayer = port.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
    info.lid = port.lid;
    info.gidCount = port.gid_tbl_len;
    out.ports.push_back(info);
  }
  return out;
}

}  // namespace

RdmaProbe probeRdma(const std::string& library) {
  RdmaProbe probe;
  auto lib = VerbsLibrary::open(library);
  if (!lib.isOk()) {
    probe.unavailable = lib.status().message();
    return probe;
  }
  const VerbsLibrary& verbs = **lib;
  int count = 0;
  errno = 0;
  VerbsLibrary::DeviceList list = verbs.deviceList(&count);
  if (!list) {
    const int err = errno;
    probe.unavailable =
        err == ENOSYS ? "no RDMA in this kernel (ibv_get_device_list: Function not implemented); a "
                        "kernel with the rdma_rxe or an RDMA NIC's driver is needed"
                      : strCat("ibv_get_device_list failed (", std::strerror(err), ")");
    return probe;
  }
  if (count <= 0) {
    probe.unavailable = "no RDMA devices (none in /sys/class/infiniband)";
    return probe;
  }
  std::string problems;
  bool anyActive = false;
  for (int i = 0; i < count; ++i) {
    probe.devices.push_back(queryDevice(verbs, list.get()[i], &problems));
    for (const RdmaPort& port : probe.devices.back().ports) anyActive = anyActive || port.active();
  }
  if (!anyActive)
    probe.unavailable = strCat("no active port on ", count, " RDMA device(s)", problems);
  return probe;
}
#else
RdmaProbe probeRdma(const std::string&) {
  RdmaProbe probe;
  probe.unavailable = "built without InfiniBand verbs (install libibverbs-dev, -Dibverbs=enabled)";
  return probe;
}
#endif

std::string describe(const RdmaProbe& probe) {
  std::string out;
  for (const RdmaDevice& d : probe.devices) {
    for (const RdmaPort& p : d.ports)
      out += strCat(out.empty() ? "" : "; ", d.name, " port ", p.number, " ", p.state, " ",
                    p.linkLayer, p.linkLayer == "InfiniBand" ? strCat(" lid ", p.lid) : "",
                    " (gids ", p.gidCount, ")");
    if (d.ports.empty()) out += strCat(out.empty() ? "" : "; ", d.name, " (no ports)");
  }
  if (!probe.available())
    out += strCat(out.empty() ? "" : "; ", "unavailable: ", probe.unavailable);
  return out;
}

}  // namespace braid::ib
