// extern "C" stream calls.
#include "src/common/log.h"
#include "src/common/strcat.h"
#include "src/device_staging.h"
#include "src/handles.h"

using braid::Status;
using braid::api::guard;

namespace {

// The next stream of `comm`, ordered on a CUDA stream where `cuda` is set.
Status makeStream(braidComm_t comm, std::shared_ptr<braid::CudaStreamBridge> cuda,
                  braidStream_t* stream) {
  BRAID_ASSIGN_OR_RETURN(int index, comm->comm->newStreamIndex());
  auto* handle = new braidStream;
  handle->stream = std::make_shared<braid::HostStream>(comm->comm, index);
  handle->cuda = std::move(cuda);
  {
    std::lock_guard lock(comm->streamsMutex);
    comm->streams.push_back(handle->stream);
  }
  *stream = handle;
  return Status::ok();
}

}  // namespace

extern "C" {

braidResult_t braidStreamCreate(braidComm_t comm, braidStream_t* stream) {
  return guard("braidStreamCreate", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(braid::api::checkComm(comm));
    if (!stream) return braid::invalidArgument("stream is NULL");
    *stream = nullptr;
    return makeStream(comm, nullptr, stream);
  });
}

braidResult_t braidStreamCreateFromCuda(braidComm_t comm, void* cudaStream, braidStream_t* stream) {
  return guard("braidStreamCreateFromCuda", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(braid::api::checkComm(comm));
    if (!stream) return braid::invalidArgument("stream is NULL");
    *stream = nullptr;
    if (!braid::gpuStagingBuilt())
      return braid::notSupported("this build of braid has no CUDA support");
    BRAID_ASSIGN_OR_RETURN(std::shared_ptr<braid::CudaStreamBridge> bridge,
                           braid::CudaStreamBridge::create(cudaStream));
    return makeStream(comm, std::move(bridge), stream);
  });
}

braidResult_t braidStreamSynchronize(braidStream_t stream) {
  return guard("braidStreamSynchronize", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(braid::api::checkStream(stream));
    return stream->stream->synchronize();
  });
}

braidResult_t braidStreamQuery(braidStream_t stream) {
  return guard("braidStreamQuery", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(braid::api::checkStream(stream));
    return stream->stream->query();
  });
}

braidResult_t braidStreamAddCallback(braidStream_t stream, braidStreamCallback_t callback,
                                     void* userData) {
  return guard("braidStreamAddCallback", [&]() -> Status {
    BRAID_RETURN_IF_ERROR(braid::api::checkStream(stream));
    if (!callback) return braid::invalidArgument("callback is NULL");
    // A group hands its calls to the stream only at braidGroupEnd, so a
    // callback queued now would run before them.
    if (braid::api::groupOpen())
      return braid::invalidUsage("inside a group: add the callback after braidGroupEnd");
    stream->stream->enqueueCallback([stream, callback, userData](const Status& outcome) {
      // The stream's error becomes the callback thread's last error, so the
      // callback can read its message with braidGetLastError.
      braid::api::setLastError(outcome.isOk() ? std::string() : outcome.message());
      auto code = static_cast<braidResult_t>(outcome.code());
      try {
        callback(stream, code, userData);
      } catch (...) {
        BRAID_WARN("a stream callback threw an exception; it was ignored");
      }
    });
    return Status::ok();
  });
}

braidResult_t braidStreamDestroy(braidStream_t stream) {
  return guard("braidStreamDestroy", [&]() -> Status {
    if (!stream) return Status::ok();
    BRAID_RETURN_IF_ERROR(braid::api::checkStream(stream));
    if (stream->stream->onWorkerThread())
      return braid::invalidUsage("a stream cannot be destroyed from one of its own callbacks");
    stream->stream.reset();  // waits for its queue
    stream->magic = 0;
    delete stream;
    return Status::ok();
  });
}

}  // extern "C"
