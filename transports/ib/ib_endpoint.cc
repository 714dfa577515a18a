#include "transports/ib/ib_endpoint.h"

#include "src/common/strcat.h"
#include "transports/ib/port_choice.h"
#include "transports/ib/rdma_probe.h"
#include "transports/ib/rdma_stream.h"
#if BRAID_IB_VERBS
#include "transports/ib/real_verbs.h"
#include "transports/ib/verbs_library.h"
#endif

namespace braid::ib {

bool verbsBuilt() {
  return BRAID_IB_VERBS != 0;
}

Status checkHcaSetting(const std::string& hca) {
  auto filter = parseHcaFilter(hca);
  return filter.isOk() ? Status::ok() : filter.status();
}

#if BRAID_IB_VERBS
namespace {

class VerbsEndpoint final : public IbEndpoint {
 public:
  VerbsEndpoint(std::unique_ptr<Device> device, RdmaStreamOptions options)
      : device_(std::move(device)), options_(options) {}

  std::string description() const override {
    return strCat(device_->name(), " port ", int{options_.port}, ", GID index ", options_.gidIndex);
  }

  Result<std::unique_ptr<transport::ByteStream>> connect(tcp::Fd socket, int peer,
                                                         Deadline deadline) override {
    tcp::SocketWire wire(socket.get(), deadline);
    BRAID_ASSIGN_OR_RETURN(std::unique_ptr<RdmaStream> stream,
                           RdmaStream::connect(*device_, wire, options_, peer));
    BRAID_RETURN_IF_ERROR(stream->watchPeerSocket(std::move(socket)));
    return std::unique_ptr<transport::ByteStream>(std::move(stream));
  }

 private:
  std::unique_ptr<Device> device_;
  RdmaStreamOptions options_;
};

}  // namespace

Result<std::unique_ptr<IbEndpoint>> IbEndpoint::open(const IbSettings& settings) {
  BRAID_ASSIGN_OR_RETURN(HcaFilter filter, parseHcaFilter(settings.hca));
  const RdmaProbe probe = probeRdma();
  if (!probe.available()) return notSupported(probe.unavailable);
  BRAID_ASSIGN_OR_RETURN(PortChoice choice, choosePort(probe, filter, settings.nearFirst));
  BRAID_ASSIGN_OR_RETURN(std::unique_ptr<VerbsLibrary> library, VerbsLibrary::open(kVerbsLibrary));
  BRAID_ASSIGN_OR_RETURN(
      std::unique_ptr<Device> device,
      openVerbsDevice(std::shared_ptr<const VerbsLibrary>(std::move(library)), choice.device));
  RdmaStreamOptions options;
  options.port = static_cast<uint8_t>(choice.port);
  BRAID_ASSIGN_OR_RETURN(options.gidIndex,
                         chooseGidIndex(*device, options.port, settings.gidIndex));
  options.timeout = static_cast<uint8_t>(settings.timeout);
  options.retryCount = static_cast<uint8_t>(settings.retryCount);
  options.registry = settings.registry;
  return std::unique_ptr<IbEndpoint>(new VerbsEndpoint(std::move(device), options));
}
#else
Result<std::unique_ptr<IbEndpoint>> IbEndpoint::open(const IbSettings& settings) {
  BRAID_RETURN_IF_ERROR(checkHcaSetting(settings.hca));
  return notSupported("this build of braid has no RDMA (built without libibverbs-dev)");
}
#endif

}  // namespace braid::ib
