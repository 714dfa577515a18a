// What the opaque C handles point to, and the helpers the ABI files share.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "include/braid.h"
#include "src/calls_in_flight.h"
#include "src/common/status.h"
#include "src/communicator.h"
#include "src/cuda_stream.h"
#include "src/stream.h"

struct braidComm {
  static constexpr uint64_t kMagic = 0x6272616964636f6dULL;  // catches use after destroy
  uint64_t magic = kMagic;
  std::shared_ptr<braid::Communicator> comm;
  std::mutex streamsMutex;
  std::vector<std::weak_ptr<braid::HostStream>> streams;
  // Application threads' calls on it, which braidCommDestroy waits for.
  braid::CallsInFlight calls;
};

struct braidStream {
  static constexpr uint64_t kMagic = 0x6272616964737472ULL;
  uint64_t magic = kMagic;
  std::shared_ptr<braid::HostStream> stream;
  // Set for a stream made by braidStreamCreateFromCuda: its calls are
  // ordered on that CUDA stream.
  std::shared_ptr<braid::CudaStreamBridge> cuda;
};

namespace braid::api {

// Runs `body`, stores a failure's message as the thread's last error
// (prefixed with the call's name), and maps it to braidResult_t. Nothing
// thrown inside escapes.
template <typename Body>
braidResult_t guard(const char* call, Body&& body);

void setLastError(const std::string& message);
const std::string& lastErrorMessage();
braidResult_t toResult(const Status& s, const char* call);

template <typename Body>
braidResult_t guard(const char* call, Body&& body) {
  const Status s = caughtAsStatus(std::forward<Body>(body));
  try {
    return toResult(s, call);
  } catch (...) {  // no memory left even for the message
    return braidSystemError;
  }
}

Status checkComm(braidComm_t comm);
Status checkStream(braidStream_t stream);

// Queues `ops` in the open group, or runs them on `stream`, or runs them now.
Status submit(braidComm_t comm, braidStream_t stream, std::vector<Operation> ops);
bool groupOpen();
// Returns `s`; where it is the failure of `call` inside an open group, the
// group keeps the first such, and braidGroupEnd returns it and runs none of
// the group's calls.
Status notedInGroup(const char* call, Status s);

// Which of an operation's buffers are on a GPU, and their sizes.
struct GpuPlacement {
  size_t sendBytes = 0, recvBytes = 0;
  bool sendOnGpu = false, recvOnGpu = false;
};
// Queues `op` in the open group. A GPU job (op.gpuOrdinal set) runs on its
// buffers after the work queued before on their GPU; other GPU buffers are
// staged through host memory (src/device_staging.h) before the group runs
// and the result copied back after. Either by braidGroupEnd for stream
// NULL, else on the stream when it reaches the group (on a CUDA stream, the
// point of braidGroupEnd). Calls on a CUDA stream go here with host buffers
// too.
Status submitStagedToGroup(braidComm_t comm, braidStream_t stream, Operation op,
                           const GpuPlacement& placement);

}  // namespace braid::api
