// What a communicator needs of RDMA, in a build with or without the verbs
// headers: whether this process can use it (a device with an active port
// that BRAID_IB_HCA allows), and a byte stream to a peer over it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "src/common/deadline.h"
#include "src/common/status.h"
#include "transports/byte_stream.h"
#include "transports/memory_registry.h"
#include "transports/tcp/socket.h"

namespace braid::ib {

struct IbSettings {
  std::string hca;     // BRAID_IB_HCA
  int gidIndex = -1;   // BRAID_IB_GID_INDEX (-1: chosen)
  int timeout = 18;    // BRAID_IB_TIMEOUT
  int retryCount = 7;  // BRAID_IB_RETRY_CNT
  // Verbs devices on the rank's NUMA node, preferred in this order.
  std::vector<std::string> nearFirst;
  // The buffers the user declared: large messages from them cross with RDMA
  // reads instead of through the rings.
  std::shared_ptr<const transport::MemoryRegistry> registry;
};

// Whether this build can use RDMA at all (it has the verbs headers).
bool verbsBuilt();

// Checks BRAID_IB_HCA's syntax, whatever the build.
Status checkHcaSetting(const std::string& hca);

class IbEndpoint {
 public:
  // This process's device and port, or why there is none (notSupported:
  // no verbs headers in the build, no libibverbs, no device, no active
  // port allowed).
  static Result<std::unique_ptr<IbEndpoint>> open(const IbSettings& settings);
  virtual ~IbEndpoint() = default;

  // "rxe0 port 1, GID index 1", for logs.
  virtual std::string description() const = 0;
  // Both ends of a pair call it with their connected bootstrap socket,
  // which the stream keeps to learn of a peer that died.
  virtual Result<std::unique_ptr<transport::ByteStream>> connect(tcp::Fd socket, int peer,
                                                                 Deadline deadline) = 0;
};

}  // namespace braid::ib
