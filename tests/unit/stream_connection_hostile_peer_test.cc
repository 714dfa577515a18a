// Hostile peers: frames and descriptors that claim more than ever arrives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "transports/stream_connection.h"
#include "transports/stream_frames.h"

namespace braid::transport {
namespace {

// A peer that sends what a test scripts, and whose memory (for descriptors)
// is `memory` of this process.
class ScriptedPeer final : public ByteStream {
 public:
  // Without `memory` the peer closes after its bytes; with it, it stays.
  explicit ScriptedPeer(std::vector<uint8_t> bytes, std::vector<uint8_t>* memory = nullptr)
      : bytes_(std::move(bytes)), memory_(memory) {}
  Result<size_t> writeSome(const iovec* iov, int count) override {
    size_t n = 0;
    for (int i = 0; i < count; ++i) {
      const auto* at = static_cast<const uint8_t*>(iov[i].iov_base);
      written.insert(written.end(), at, at + iov[i].iov_len);
      n += iov[i].iov_len;
    }
    return n;
  }
  Result<size_t> readSome(void* into, size_t room) override {
    if (at_ == bytes_.size()) {
      if (memory_) return size_t{0};
      return remoteError("the peer closed the connection");
    }
    const size_t n = std::min(room, bytes_.size() - at_);
    std::memcpy(into, bytes_.data() + at_, n);
    at_ += n;
    return n;
  }
  void writeLast(const iovec*, int) override {}
  void close() override {}
  int pollFd() const override { return -1; }
  bool pollForWrite(bool) const override { return false; }
  bool canReadPeer() const override { return memory_ != nullptr; }
  Status readPeer(void* into, uint64_t address, uint64_t, size_t bytes) override {
    const auto base = reinterpret_cast<uintptr_t>(memory_->data());
    if (address < base || address - base > memory_->size() ||
        bytes > memory_->size() - (address - base))
      return errnoStatus("process_vm_readv", EFAULT);
    std::memcpy(into, memory_->data() + (address - base), bytes);
    return Status::ok();
  }
  bool canWritePeer() const override { return memory_ != nullptr; }
  Status writePeer(uint64_t, uint64_t, const void*, size_t) override {
    ++writes;
    return Status::ok();
  }

  std::vector<uint8_t> written;  // every byte the connection wrote to this peer
  size_t writes = 0;

 private:
  std::vector<uint8_t> bytes_;
  size_t at_ = 0;
  std::vector<uint8_t>* memory_;
};

std::vector<uint8_t> header(uint64_t tag, uint64_t check, uint64_t bytes, uint64_t remote,
                            uint64_t key = 0) {
  const StreamConnection::FrameHeader h{tag, check, bytes, remote, key};
  std::vector<uint8_t> out(sizeof h);
  std::memcpy(out.data(), &h, sizeof h);
  return out;
}

// A corrupt or hostile peer may claim any size in a frame header. The
// receiver holds only what actually arrives: here 100 bytes of a frame
// claiming 2^62, then the end of the stream, which fails the connection
// cleanly instead of an allocation of the claimed size failing (or worse,
// succeeding).
TEST(HostilePeer, FrameClaimingAnyLengthCostsOnlyWhatArrives) {
  std::vector<uint8_t> bytes = header(5, 7, uint64_t{1} << 62, 0);
  bytes.resize(bytes.size() + 100, 'x');
  StreamConnection c(std::make_unique<ScriptedPeer>(std::move(bytes)), 1);
  Result<bool> moved = c.progress();
  ASSERT_FALSE(moved.isOk());
  EXPECT_EQ(moved.status().code(), ErrorCode::kRemoteError) << moved.status().message();
}

// A descriptor names the sender's memory; one that claims more than the
// sender has fails when copied, before the receiver allocates room for it.
TEST(HostilePeer, DescriptorClaimingMoreThanThePeerHasFailsTheConnection) {
  std::vector<uint8_t> memory(4096, 1);
  const auto remote = reinterpret_cast<uintptr_t>(memory.data());
  StreamConnection::Options copyAtOnce;
  copyAtOnce.unclaimedDescriptorWait = std::chrono::microseconds(0);
  for (uint64_t claimed : {uint64_t{1} << 62, uint64_t{1} << 33, ~uint64_t{0} - remote + 2}) {
    StreamConnection c(std::make_unique<ScriptedPeer>(header(5, 7, claimed, remote), &memory), 1,
                       copyAtOnce);
    Result<bool> moved = c.progress();       // the descriptor arrives
    if (moved.isOk()) moved = c.progress();  // and goes unclaimed
    ASSERT_FALSE(moved.isOk()) << claimed;
    EXPECT_NE(moved.status().code(), ErrorCode::kOk);
    EXPECT_FALSE(moved.status().message().empty());
  }
}

// A push answer names a receive that asked for one; any other is a broken
// peer's, and ends the connection rather than being taken as a count of
// bytes written into this rank's memory.
TEST(HostilePeer, PushAnswerNobodyAskedForFailsTheConnection) {
  std::vector<uint8_t> memory(4096, 1);
  StreamConnection c(std::make_unique<ScriptedPeer>(header(kPushedTag, 5, 4096, 1234), &memory), 1);
  Result<bool> moved = c.progress();
  ASSERT_FALSE(moved.isOk());
  EXPECT_EQ(moved.status().code(), ErrorCode::kRemoteError);
  EXPECT_NE(moved.status().message().find("not asked for"), std::string::npos)
      << moved.status().message();
}

// A push asks the sender to write part of its payload into the receiver;
// one that claims a head longer than the payload is answered with nothing
// written, and the send still waits for its ack.
TEST(HostilePeer, PushPastThePayloadIsDeclined) {
  std::vector<uint8_t> memory(4096, 1), payload(1 << 20, 2);
  const auto remote = reinterpret_cast<uintptr_t>(payload.data());
  auto script = std::make_unique<ScriptedPeer>(
      header(kPushTag, 5, payload.size() + 1, remote, 0x10000), &memory);
  ScriptedPeer* peer = script.get();
  StreamConnection c(std::move(script), 1);
  RequestPtr s = c.postSend(payload.data(), payload.size(), {5, 7});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.progress().isOk());
  EXPECT_EQ(s->state(), Request::State::kPending);
  EXPECT_EQ(peer->writes, 0u);
  const size_t frame = sizeof(StreamConnection::FrameHeader);
  ASSERT_EQ(peer->written.size(), 2 * frame) << "the descriptor, then the answer";
  StreamConnection::FrameHeader answer{};
  std::memcpy(&answer, peer->written.data() + frame, frame);
  EXPECT_EQ(answer.tag, kPushedTag);
  EXPECT_EQ(answer.check, 5u);
  EXPECT_EQ(answer.remote, remote);
  EXPECT_EQ(answer.bytes, 0u);
}

}  // namespace
}  // namespace braid::transport
