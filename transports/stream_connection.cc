#include "transports/stream_connection.h"

#include <cerrno>
#include <cstring>

#include "src/common/strcat.h"

namespace braid::transport {

namespace {
constexpr size_t kStagingBytes = 256 << 10;
// Payloads at least this large bypass the staging buffer.
constexpr size_t kDirectBytes = 32 << 10;
constexpr int kMaxIov = 64;  // IOV_MAX is 1024; 64 frames per write is plenty

uint64_t channelBase(uint64_t tag) {
  return tag & (uint64_t{0xff} << 56);
}
}  // namespace

StreamConnection::StreamConnection(std::unique_ptr<ByteStream> stream, int peer)
    : stream_(std::move(stream)), peer_(peer), staging_(kStagingBytes) {}

StreamConnection::~StreamConnection() {
  abort(Status(ErrorCode::kOk, "connection closed"));
}

namespace {
// A frame in this channel is the last one on a connection: its check is the
// ErrorCode of why the sender ended it and its payload the message, so the
// peer can report the cause instead of a bare "connection closed".
constexpr uint64_t kGoodbyeChannel = uint64_t{0xff} << 56;
constexpr size_t kGoodbyeMessageBytes = 512;
}  // namespace

Status StreamConnection::deadStatus() const {
  return dead_;
}

RequestPtr StreamConnection::postSend(const void* data, size_t bytes, Tag tag) {
  auto request = std::make_shared<Request>();
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) {
    request->fail(dead_);
    return request;
  }
  sends_.push_back({{tag.value, tag.check, bytes}, static_cast<const uint8_t*>(data), 0, request});
  sendsPending_ = true;
  return request;
}

void StreamConnection::deliver(const PostedRecv& p, const uint8_t* payload) {
  if (p.bytes == 0) return;
  if (p.reduces())
    p.combiner.apply(p.data, p.local, payload, p.bytes / p.combiner.unit, p.combiner.context);
  else
    std::memcpy(p.data, payload, p.bytes);
}

void StreamConnection::combineArriving(const uint8_t* in, size_t n) {
  const Combiner& c = matched_->combiner;
  size_t at = payloadGot_;  // payload bytes consumed before `in`
  if (const size_t part = at % c.unit; part != 0) {
    const size_t fill = std::min(n, c.unit - part);
    std::memcpy(carry_ + part, in, fill);
    in += fill;
    n -= fill;
    at += fill;
    if (at % c.unit != 0) return;
    const size_t element = at - c.unit;
    c.apply(matched_->data + element, matched_->local + element, carry_, 1, c.context);
  }
  const size_t whole = n / c.unit * c.unit;
  if (whole) c.apply(matched_->data + at, matched_->local + at, in, whole / c.unit, c.context);
  if (n > whole) std::memcpy(carry_, in + whole, n - whole);
}

RequestPtr StreamConnection::postRecv(void* data, size_t bytes, Tag tag) {
  return postRecvReduce(data, nullptr, bytes, tag, {});
}

RequestPtr StreamConnection::postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                                            const Combiner& combiner) {
  auto request = std::make_shared<Request>();
  PostedRecv posted{static_cast<uint8_t*>(dst),         bytes,   tag.check, request,
                    static_cast<const uint8_t*>(local), combiner};
  std::lock_guard lock(mutex_);
  // A message that arrived before the peer closed is still delivered.
  if (auto it = unexpected_.find(tag.value); it != unexpected_.end()) {
    Unexpected& u = it->second;
    if (u.check != tag.check || u.payload.size != bytes) {
      request->fail(invalidUsage(strCat("message from rank ", peer_, " does not match")),
                    Request::Failure::kDifferentCall, Tag{tag.value, u.check});
    } else {
      deliver(posted, u.payload.data());
      request->complete();
    }
    unexpected_.erase(it);
    return request;
  }
  if (!dead_.isOk()) {
    request->fail(dead_);
    return request;
  }
  const uint8_t channel = tag.channel();
  bool arriving = inPayload_ && !matched_ && header_.tag == tag.value;
  if (!arriving && highestArrived_[channel] > tag.value + 1) {
    // The peer already sent something later in this channel: this message
    // will never come, the two ranks called different things.
    request->fail(invalidUsage(strCat("rank ", peer_, " moved past this message")),
                  Request::Failure::kOvertaken, Tag{highestArrived_[channel] - 1, 0});
    return request;
  }
  posted_[tag.value] = posted;
  return request;
}

Result<bool> StreamConnection::progress() {
  std::lock_guard lock(mutex_);
  if (!dead_.isOk()) return dead_;
  BRAID_ASSIGN_OR_RETURN(bool sent, sendSome());
  BRAID_ASSIGN_OR_RETURN(bool received, recvSome());
  return sent || received;
}

Result<bool> StreamConnection::sendSome() {
  bool moved = false;
  while (!sends_.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = sends_.begin(); it != sends_.end() && n + 2 <= kMaxIov; ++it) {
      size_t skip = it->sent;
      const size_t headerBytes = sizeof(FrameHeader);
      if (skip < headerBytes) {
        iov[n++] = {reinterpret_cast<uint8_t*>(&it->header) + skip, headerBytes - skip};
        skip = 0;
      } else {
        skip -= headerBytes;
      }
      if (it->header.bytes > skip)
        iov[n++] = {const_cast<uint8_t*>(it->data) + skip, it->header.bytes - skip};
    }
    auto wrote = stream_->writeSome(iov, n);
    if (!wrote.isOk()) {
      failAll(wrote.status());
      return wrote.status();
    }
    if (*wrote == 0) break;
    moved = true;
    size_t left = *wrote;
    while (left > 0) {
      PendingSend& front = sends_.front();
      const size_t total = sizeof(FrameHeader) + front.header.bytes;
      const size_t take = std::min(left, total - front.sent);
      front.sent += take;
      left -= take;
      if (front.sent < total) break;
      front.request->complete();
      sends_.pop_front();
    }
  }
  sendsPending_ = !sends_.empty();
  return moved;
}

void StreamConnection::failPostedBefore(uint64_t tag, const Tag& arrived) {
  auto it = posted_.lower_bound(channelBase(tag));
  while (it != posted_.end() && it->first < tag) {
    it->second.request->fail(invalidUsage(strCat("rank ", peer_, " moved past this message")),
                             Request::Failure::kOvertaken, arrived);
    it = posted_.erase(it);
  }
}

void StreamConnection::startFrame() {
  inPayload_ = true;
  payloadGot_ = 0;
  matched_ = nullptr;
  if (channelBase(header_.tag) == kGoodbyeChannel) {
    spill_ = Payload::allocate(std::min<uint64_t>(header_.bytes, kGoodbyeMessageBytes));
    header_.bytes = spill_.size;
    target_ = spill_.data();
    return;
  }
  const Tag arrived{header_.tag, header_.check};
  uint64_t& highest = highestArrived_[arrived.channel()];
  highest = std::max(highest, header_.tag + 1);
  failPostedBefore(header_.tag, arrived);
  if (auto it = posted_.find(header_.tag); it != posted_.end()) {
    PostedRecv& p = it->second;
    if (p.check == header_.check && p.bytes == header_.bytes) {
      matched_ = &p;
      target_ = p.data;
      return;
    }
    p.request->fail(invalidUsage(strCat("message from rank ", peer_, " does not match (",
                                        header_.bytes, " bytes arrived, ", p.bytes, " expected)")),
                    Request::Failure::kDifferentCall, arrived);
    posted_.erase(it);
  }
  spill_ = Payload::allocate(header_.bytes);
  target_ = spill_.data();
}

void StreamConnection::finishFrame() {
  if (channelBase(header_.tag) == kGoodbyeChannel) {
    std::string why(spill_.data(), spill_.data() + spill_.size);
    // Only a mismatch is the peer's verdict on this call too; anything else
    // means the peer failed or left.
    const auto code = static_cast<ErrorCode>(header_.check);
    Status s = code == ErrorCode::kInvalidUsage
                   ? invalidUsage(why)
                   : remoteError(strCat("rank ", peer_, " ended the connection: ", why));
    if (code != ErrorCode::kOk && !peerFailed_) {
      peerFailure_ = s;
      peerFailed_ = true;
    }
    failAll(s);
    inPayload_ = false;
    headerGot_ = 0;
    return;
  }
  if (matched_) {
    matched_->request->complete();
    posted_.erase(header_.tag);
  } else {
    // A receive posted while the payload was arriving is matched now.
    if (auto it = posted_.find(header_.tag); it != posted_.end()) {
      PostedRecv& p = it->second;
      if (p.check == header_.check && p.bytes == header_.bytes) {
        deliver(p, spill_.data());
        p.request->complete();
      } else {
        p.request->fail(invalidUsage(strCat("message from rank ", peer_, " does not match")),
                        Request::Failure::kDifferentCall, Tag{header_.tag, header_.check});
      }
      posted_.erase(it);
    } else {
      unexpected_[header_.tag] = {header_.check, std::move(spill_)};
    }
    spill_ = {};
  }
  inPayload_ = false;
  headerGot_ = 0;
  matched_ = nullptr;
}

Result<bool> StreamConnection::recvSome() {
  bool moved = false;
  while (true) {
    // Consume what is staged.
    while (stagingBegin_ < stagingEnd_ && dead_.isOk()) {
      size_t avail = stagingEnd_ - stagingBegin_;
      if (!inPayload_) {
        size_t take = std::min(avail, sizeof(FrameHeader) - headerGot_);
        std::memcpy(reinterpret_cast<uint8_t*>(&header_) + headerGot_, &staging_[stagingBegin_],
                    take);
        headerGot_ += take;
        stagingBegin_ += take;
        if (headerGot_ == sizeof(FrameHeader)) {
          startFrame();
          if (header_.bytes == 0) finishFrame();
        }
      } else {
        size_t take = std::min(avail, header_.bytes - payloadGot_);
        if (matched_ && matched_->reduces())
          combineArriving(&staging_[stagingBegin_], take);
        else
          std::memcpy(target_ + payloadGot_, &staging_[stagingBegin_], take);
        payloadGot_ += take;
        stagingBegin_ += take;
        if (payloadGot_ == header_.bytes) finishFrame();
      }
    }
    if (!dead_.isOk()) return dead_;
    stagingBegin_ = stagingEnd_ = 0;
    uint8_t* into = staging_.data();
    size_t room = staging_.size();
    // A payload to be reduced goes through staging, which stays in cache.
    bool direct = inPayload_ && !(matched_ && matched_->reduces()) &&
                  header_.bytes - payloadGot_ >= kDirectBytes;
    if (direct) {
      into = target_ + payloadGot_;
      room = header_.bytes - payloadGot_;
    }
    auto got = stream_->readSome(into, room);
    if (!got.isOk()) {
      failAll(got.status());
      return got.status();
    }
    if (*got == 0) return moved;
    moved = true;
    if (direct) {
      payloadGot_ += *got;
      if (payloadGot_ == header_.bytes) finishFrame();
    } else {
      stagingEnd_ = *got;
    }
  }
}

void StreamConnection::failAll(const Status& reason) {
  if (dead_.isOk()) dead_ = reason;
  for (auto& s : sends_) s.request->fail(reason);
  sends_.clear();
  sendsPending_ = false;
  for (auto& [tag, p] : posted_) p.request->fail(reason);
  posted_.clear();
}

void StreamConnection::abort(const Status& reason) {
  std::lock_guard lock(mutex_);
  // Say goodbye unless a frame is half written (that would break framing)
  // or the connection is already dead. Best effort: never blocks.
  bool midFrame = !sends_.empty() && sends_.front().sent > 0;
  if (dead_.isOk() && !midFrame) {
    std::string why = reason.message().substr(0, kGoodbyeMessageBytes);
    FrameHeader goodbye{kGoodbyeChannel, static_cast<uint64_t>(reason.code()), why.size()};
    iovec iov[2] = {{&goodbye, sizeof(goodbye)}, {why.data(), why.size()}};
    stream_->writeLast(iov, 2);
  }
  failAll(reason.isOk() ? remoteError(reason.message()) : reason);
  stream_->close();
}

bool StreamConnection::prepareToSleep() {
  std::lock_guard lock(mutex_);
  return !dead_.isOk() || stream_->prepareToSleep(!sends_.empty());
}

Status StreamConnection::peerFailure() const {
  return peerFailed_.load(std::memory_order_acquire) ? peerFailure_ : Status::ok();
}

std::optional<Tag> StreamConnection::unclaimed(uint8_t channel, uint64_t below) {
  std::lock_guard lock(mutex_);
  auto it = unexpected_.lower_bound(uint64_t{channel} << 56);
  if (it == unexpected_.end() || it->first >= below || (it->first >> 56) != channel)
    return std::nullopt;
  return Tag{it->first, it->second.check};
}

}  // namespace braid::transport
