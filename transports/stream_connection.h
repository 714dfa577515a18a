// A Connection over one ByteStream (a TCP socket, shared-memory rings).
// Frames are {tag, check, bytes} followed by the payload. Large payloads
// move between the stream and the caller's memory directly; small ones go
// through a staging buffer so that one read can carry many frames.
#pragma once

#include <sys/uio.h>

#include <array>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "transports/byte_stream.h"
#include "transports/transport.h"

namespace braid::transport {

class StreamConnection final : public Connection {
 public:
  StreamConnection(std::unique_ptr<ByteStream> stream, int peer);
  ~StreamConnection() override;

  RequestPtr postSend(const void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecv(void* data, size_t bytes, Tag tag) override;
  RequestPtr postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                            const Combiner& combiner) override;
  Result<bool> progress() override;
  int pollFd() const override { return stream_->pollFd(); }
  bool wantsWrite() const override {
    return stream_->pollForWrite(sendsPending_.load(std::memory_order_relaxed));
  }
  bool prepareToSleep() override;
  void abort(const Status& reason) override;
  int peer() const override { return peer_; }
  Status peerFailure() const override;
  std::optional<Tag> unclaimed(uint8_t channel, uint64_t below) override;

 private:
  struct FrameHeader {
    uint64_t tag;
    uint64_t check;
    uint64_t bytes;
  };
  struct PendingSend {
    FrameHeader header;
    const uint8_t* data;
    size_t sent;  // of header + payload
    RequestPtr request;
  };
  struct PostedRecv {
    uint8_t* data;
    size_t bytes;
    uint64_t check;
    RequestPtr request;
    const uint8_t* local = nullptr;  // receives with reduction only
    Combiner combiner;
    bool reduces() const { return combiner.apply != nullptr; }
  };
  // Uninitialised bytes: a payload is written whole before it is read, and
  // zeroing it first would only fault its pages in twice.
  struct Payload {
    std::unique_ptr<uint8_t[]> bytes;
    size_t size = 0;
    static Payload allocate(size_t n) { return {std::unique_ptr<uint8_t[]>(new uint8_t[n]), n}; }
    uint8_t* data() { return bytes.get(); }
  };
  struct Unexpected {
    uint64_t check;
    Payload payload;
  };

  Result<bool> sendSome();
  Result<bool> recvSome();
  void startFrame();
  void finishFrame();
  // Puts a whole payload where the receive wants it.
  static void deliver(const PostedRecv& p, const uint8_t* payload);
  // Combines the next `n` payload bytes of the matched receive with reduction.
  void combineArriving(const uint8_t* in, size_t n);
  void failPostedBefore(uint64_t tag, const Tag& arrived);
  void failAll(const Status& reason);
  Status deadStatus() const;

  std::unique_ptr<ByteStream> stream_;
  const int peer_;
  mutable std::mutex mutex_;
  std::atomic<bool> sendsPending_{false};
  Status dead_;  // set once the connection failed or was aborted
  std::atomic<bool> peerFailed_{false};
  Status peerFailure_;  // written once, before peerFailed_

  std::deque<PendingSend> sends_;
  std::map<uint64_t, PostedRecv> posted_;
  std::map<uint64_t, Unexpected> unexpected_;
  std::array<uint64_t, 256> highestArrived_{};  // per channel, +1 (0 = none)

  // Incoming frame being read.
  FrameHeader header_{};
  size_t headerGot_ = 0;
  bool inPayload_ = false;
  uint8_t* target_ = nullptr;  // where the payload goes (posted or unexpected)
  size_t payloadGot_ = 0;
  PostedRecv* matched_ = nullptr;
  Payload spill_;      // payload with no posted receive yet
  uint8_t carry_[16];  // an element split between two reads

  std::vector<uint8_t> staging_;
  size_t stagingBegin_ = 0, stagingEnd_ = 0;
};

}  // namespace braid::transport
