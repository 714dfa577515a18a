// StreamConnection reading what a peer sent: frame headers, payloads,
// goodbyes, acknowledgements and single-copy descriptors, in any split, with
// receives posted before, during and after their frames arrive. The peer is
// a fake ByteStream that hands over the input's bytes; it can also offer a
// region of "peer memory" for descriptors. The connection must never crash,
// write outside a posted buffer, hand a combiner a misaligned element, or
// allocate more than the bytes that actually arrived could need.
//
// Input: one byte of options, then commands, each an opcode byte and its
// arguments (integers little-endian; a command cut short by the end of the
// input is dropped):
//   0 bytes  u16 n, then n bytes the peer sends
//   1 fill   u32 n, u8 b: the peer sends n bytes b (512 KiB in all at most)
//   2 frame  u8 channel, u16 k, u8 check, u32 bytes, u8 kind: the peer sends
//            a frame header, tag (channel << 56) | k; kind 1 makes it a
//            descriptor of the peer memory at offset k, kind 2 an ack, kind 3
//            a goodbye; a payload, if any, comes from later commands
//   3 recv   u8 channel, u16 k, u8 check, u32 bytes (at most 3 MiB)
//   4 reduce the same and u8 unit (1, 2, 4 or 8 bytes): a receive with reduction
//   5 send   u8 channel, u16 k, u8 check, u32 bytes (at most 3 MiB)
//   6 progress
//   7 about to sleep (prepareToSleep)
//   8 unclaimed u8 channel, u64 below
//   9 the peer closes its end (after the bytes sent so far)
//  10 abort
//  11 room   u16 n: bytes the peer takes per write from now on (0: none)
//  12 chunk  u16 n: bytes the peer hands over per read (0: all there are)
// Options: bit 0 the stream can read the peer memory; bit 1 sends of 64
// bytes or more go as descriptors (else only of 64 KiB); bit 2 unclaimed
// descriptors are copied at once (else never).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "tests/fuzz/fuzz_common.h"
#include "transports/stream_connection.h"

using braid::Result;
using braid::Status;
using braid::transport::ByteStream;
using braid::transport::Request;
using braid::transport::RequestPtr;
using braid::transport::StreamConnection;
using braid::transport::Tag;

namespace {

// Large enough for every path (direct reads, growing spills, descriptors
// copied in pieces), small enough for thousands of inputs a second.
constexpr uint64_t kPeerMemoryBase = 0x7e0000000000;
constexpr size_t kPeerMemoryBytes = 3 << 20;
constexpr size_t kMaxMessageBytes = 3 << 20;
constexpr size_t kMaxSentBytes = 512 << 10;
constexpr size_t kMaxPostedBytes = 8 << 20;
constexpr size_t kSmallPieces = 4096;

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  bool has(size_t n) const { return size_ - at_ >= n; }
  template <typename T>
  T take() {
    T v{};
    std::memcpy(&v, data_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  const uint8_t* skip(size_t n) {
    const uint8_t* p = data_ + at_;
    at_ += n;
    return p;
  }
  size_t left() const { return size_ - at_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// The peer, as the connection sees it through its stream.
class FakePeer final : public ByteStream {
 public:
  explicit FakePeer(bool readablePeer) : readablePeer_(readablePeer) {}

  Result<size_t> writeSome(const iovec* iov, int count) override {
    if (closed_) return braid::remoteError("closed");
    size_t wanted = 0;
    for (int i = 0; i < count; ++i) {
      // Every byte the connection offers must be readable.
      FUZZ_CHECK(iov[i].iov_len == 0 || iov[i].iov_base != nullptr);
      if (iov[i].iov_len > 0) {
        volatile uint8_t first = static_cast<const uint8_t*>(iov[i].iov_base)[0];
        volatile uint8_t last = static_cast<const uint8_t*>(iov[i].iov_base)[iov[i].iov_len - 1];
        (void)first, (void)last;
      }
      wanted += iov[i].iov_len;
    }
    // Small pieces for a while: enough to split every frame, not so many
    // that an input runs for seconds.
    return ++writes_ > kSmallPieces ? wanted : std::min(wanted, writeRoom);
  }
  Result<size_t> readSome(void* into, size_t room) override {
    if (closed_) return braid::remoteError("closed");
    const size_t available = incoming_.size() - consumed_;
    if (available == 0) {
      if (peerClosed) return braid::remoteError("the peer closed the connection");
      return size_t{0};
    }
    size_t n = std::min(available, room);
    if (readChunk > 0 && ++reads_ <= kSmallPieces) n = std::min(n, readChunk);
    std::memcpy(into, incoming_.data() + consumed_, n);
    consumed_ += n;
    if (consumed_ == incoming_.size()) incoming_.clear(), consumed_ = 0;
    return n;
  }
  void writeLast(const iovec*, int) override {}
  void close() override { closed_ = true; }
  int pollFd() const override { return -1; }
  bool pollForWrite(bool sendsPending) const override { return sendsPending; }
  bool canReadPeer() const override { return readablePeer_; }
  Status readPeer(void* into, uint64_t address, uint64_t, size_t bytes) override {
    if (!readablePeer_) return braid::notSupported("no peer memory");
    if (address < kPeerMemoryBase || address - kPeerMemoryBase > kPeerMemoryBytes ||
        bytes > kPeerMemoryBytes - (address - kPeerMemoryBase))
      return braid::errnoStatus("process_vm_readv", EFAULT);
    if (bytes > 0) std::memcpy(into, memory() + (address - kPeerMemoryBase), bytes);
    return Status::ok();
  }

  void send(const void* data, size_t n) {
    n = std::min(n, kMaxSentBytes - std::min(kMaxSentBytes, sent_));
    const auto* p = static_cast<const uint8_t*>(data);
    incoming_.insert(incoming_.end(), p, p + n);
    sent_ += n;
  }
  void fill(size_t n, uint8_t b) {
    n = std::min(n, kMaxSentBytes - std::min(kMaxSentBytes, sent_));
    incoming_.insert(incoming_.end(), n, b);
    sent_ += n;
  }

  size_t writeRoom = SIZE_MAX;
  size_t readChunk = 0;
  bool peerClosed = false;

 private:
  const bool readablePeer_;
  bool closed_ = false;
  std::vector<uint8_t> incoming_;
  size_t consumed_ = 0;
  size_t sent_ = 0;
  size_t reads_ = 0, writes_ = 0;

  static const uint8_t* memory() {
    static const std::vector<uint8_t> bytes = [] {
      std::vector<uint8_t> v(kPeerMemoryBytes);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 7 + (i >> 12));
      return v;
    }();
    return bytes.data();
  }
};

// XOR of whole elements; checks what the connection promises combiners.
void combine(void* dst, const void* local, const void* incoming, size_t units,
             const void* context) {
  const size_t unit = *static_cast<const size_t*>(context);
  for (const void* p : {static_cast<const void*>(dst), local, incoming})
    FUZZ_CHECK(reinterpret_cast<uintptr_t>(p) % unit == 0);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* l = static_cast<const uint8_t*>(local);
  const auto* in = static_cast<const uint8_t*>(incoming);
  for (size_t i = 0; i < units * unit; ++i) d[i] = l[i] ^ in[i];
}

constexpr size_t kUnits[4] = {1, 2, 4, 8};

struct Posted {
  RequestPtr request;
  std::unique_ptr<uint64_t[]> buffer;  // uint64_t: aligned for every unit
  std::unique_ptr<uint64_t[]> local;
};

uint64_t tagValue(uint8_t channel, uint16_t k) {
  // Channel 0xff is the connection's own; callers never post on it.
  return uint64_t{static_cast<uint8_t>(channel % 0xff)} << 56 | k;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Input in(data + 1, size - 1);
  const uint8_t options = data[0];
  auto stream = std::make_unique<FakePeer>((options & 1) != 0);
  FakePeer& peer = *stream;
  StreamConnection::Options connectionOptions;
  connectionOptions.readPeerBytes = (options & 2) ? 64 : 64 << 10;
  connectionOptions.unclaimedDescriptorWait =
      (options & 4) ? std::chrono::microseconds(0) : std::chrono::hours(1);
  auto connection = std::make_unique<StreamConnection>(std::move(stream), 1, connectionOptions);

  std::vector<Posted> posted;
  std::map<uint64_t, RequestPtr> receiving;  // by tag value
  size_t postedBytes = 0;
  auto allocate = [&](size_t bytes) {
    return std::unique_ptr<uint64_t[]>(new uint64_t[(bytes + 7) / 8]);
  };

  // Runs the commands; returns at the first one the input cuts short.
  auto run = [&] {
    while (!in.empty()) {
      const uint8_t op = in.take<uint8_t>() % 13;
      switch (op) {
        case 0: {
          if (!in.has(2)) return;
          const size_t n = std::min<size_t>(in.take<uint16_t>(), in.left());
          peer.send(in.skip(n), n);
          break;
        }
        case 1: {
          if (!in.has(5)) return;
          const size_t n = in.take<uint32_t>();
          peer.fill(n, in.take<uint8_t>());
          break;
        }
        case 2: {
          if (!in.has(9)) return;
          const uint8_t channel = in.take<uint8_t>();
          const uint16_t k = in.take<uint16_t>();
          const uint8_t check = in.take<uint8_t>();
          const uint32_t bytes = in.take<uint32_t>();
          const uint8_t kind = in.take<uint8_t>() % 4;
          StreamConnection::FrameHeader header{uint64_t{channel} << 56 | k, check, bytes, 0, 0};
          if (kind == 1) header.remote = kPeerMemoryBase + k;
          if (kind == 2) header.tag = uint64_t{0xff} << 56 | 1, header.remote = k;
          if (kind == 3) header.tag = uint64_t{0xff} << 56;
          peer.send(&header, sizeof header);
          break;
        }
        case 3:
        case 4:
        case 5: {
          if (!in.has(8) || (op == 4 && !in.has(9))) return;
          const uint8_t channel = in.take<uint8_t>();
          const uint16_t k = in.take<uint16_t>();
          const Tag tag{tagValue(channel, k), in.take<uint8_t>()};
          const size_t bytes = in.take<uint32_t>() % (kMaxMessageBytes + 1);
          if (postedBytes + 2 * bytes > kMaxPostedBytes) break;
          // The engine never waits twice for one message: a second receive of
          // a tag would take the first one's place.
          if (op != 5) {
            auto& previous = receiving[tag.value];
            if (previous && previous->state() == Request::State::kPending) break;
          }
          postedBytes += 2 * bytes;
          Posted p;
          p.buffer = allocate(bytes);
          if (op == 3) {
            p.request = connection->postRecv(p.buffer.get(), bytes, tag);
          } else if (op == 4) {
            const size_t* unit = &kUnits[in.take<uint8_t>() % 4];
            p.local = allocate(bytes);
            p.request = connection->postRecvReduce(p.buffer.get(), p.local.get(), bytes, tag,
                                                   {*unit, &combine, unit});
          } else {
            p.request = connection->postSend(p.buffer.get(), bytes, tag);
          }
          if (op != 5) receiving[tag.value] = p.request;
          posted.push_back(std::move(p));
          break;
        }
        case 6:
          braid::fuzz::checkResult(connection->progress());
          break;
        case 7:
          (void)connection->prepareToSleep();
          break;
        case 8: {
          if (!in.has(9)) return;
          const uint8_t channel = in.take<uint8_t>();
          const uint64_t below = in.take<uint64_t>();
          if (auto tag = connection->unclaimed(channel, below)) {
            FUZZ_CHECK(tag->channel() == channel);
            FUZZ_CHECK(tag->value < below);
          }
          break;
        }
        case 9:
          peer.peerClosed = true;
          break;
        case 10:
          connection->abort(braid::remoteError("aborted"));
          break;
        case 11:
          if (!in.has(2)) return;
          peer.writeRoom = in.take<uint16_t>();
          break;
        case 12:
          if (!in.has(2)) return;
          peer.readChunk = in.take<uint16_t>();
          break;
      }
    }
  };
  run();
  for (int i = 0; i < 4; ++i) braid::fuzz::checkResult(connection->progress());
  for (const Posted& p : posted)
    if (p.request->state() == Request::State::kFailed) braid::fuzz::checkStatus(p.request->error());
  // Closing fails whatever is still pending: nothing is left waiting.
  connection.reset();
  for (const Posted& p : posted) FUZZ_CHECK(p.request->state() != Request::State::kPending);
  return 0;
}
