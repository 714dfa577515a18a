// StreamConnection's descriptor path: a large payload in memory the peer
// can read (process_vm_readv, an RDMA read) is sent as a descriptor, its
// address and key; the receiver copies it straight out of the sender's
// buffer and acks, and the send completes on the ack.
#include <algorithm>

#include "src/common/strcat.h"
#include "transports/stream_connection.h"
#include "transports/stream_frames.h"

namespace braid::transport {

namespace {
// Bytes of descriptors' payloads copied per progress() call at most, so that
// one huge message does not hold up the caller's other connections.
constexpr size_t kPullBytesPerProgress = 1 << 20;
// The first piece of a descriptor's payload copied out unclaimed.
constexpr size_t kFirstCopyOutBytes = 1 << 20;
}  // namespace

void StreamConnection::ackArrived() {
  for (auto it = awaitingAck_.begin(); it != awaitingAck_.end(); ++it)
    if (it->header.tag == header_.check && it->header.remote == header_.remote) {
      it->request->complete();
      awaitingAck_.erase(it);
      return;
    }
}

void StreamConnection::descriptorArrived() {
  const Tag arrived{header_.tag, header_.check};
  uint64_t& highest = highestArrived_[arrived.channel()];
  highest = std::max(highest, header_.tag + 1);
  failPostedBefore(header_.tag, arrived);
  Unexpected u{header_.check, header_.bytes, {}, header_.remote, std::chrono::steady_clock::now(),
               header_.key};
  if (auto it = posted_.find(header_.tag); it != posted_.end()) {
    PostedRecv& p = it->second;
    if (p.check == header_.check && p.bytes == header_.bytes) {
      p.remote = header_.remote;
      p.remoteKey = header_.key;
      p.copied = 0;
      pulls_.push_back(header_.tag);
      return;
    }
    p.request->fail(invalidUsage(strCat("message from rank ", peer_, " does not match (",
                                        header_.bytes, " bytes arrived, ", p.bytes, " expected)")),
                    Request::Failure::kDifferentCall, arrived);
    posted_.erase(it);
    // Kept like a payload that came through the stream, which its sender
    // would not have waited for.
    if (Status s = copyOut(header_.tag, u); !s.isOk()) return;
  } else {
    ++unexpectedDescriptors_;
  }
  if (auto old = unexpected_.find(header_.tag); old != unexpected_.end() && old->second.remote) {
    // A repeated tag (a broken peer): release the buffer of the first.
    --unexpectedDescriptors_;
    queueAck(header_.tag, old->second.remote, nullptr);
  }
  unexpected_[header_.tag] = std::move(u);
  unexpectedCount_.store(unexpected_.size(), std::memory_order_relaxed);
}

void StreamConnection::queueAck(uint64_t tag, uint64_t remote, RequestPtr request) {
  // Ahead of every frame not yet begun: the peer waits on it.
  auto at = sends_.begin();
  if (at != sends_.end() && at->sent > 0) ++at;
  sends_.insert(at, {{kAckTag, tag, 0, remote}, nullptr, 0, std::move(request)});
  sendsPending_ = true;
}

Status StreamConnection::copyOut(uint64_t tag, Unexpected& u) {
  // In pieces that double, the buffer growing only once the piece before
  // was there to copy: a descriptor that claims more than the peer has
  // fails before this rank makes room for all of it.
  Status s;
  if (u.bytes > 0 && u.bytes - 1 > ~uint64_t{0} - u.remote)
    s = remoteError(strCat("rank ", peer_, " sent a descriptor past the end of memory"));
  for (size_t copied = 0; s.isOk() && copied < u.bytes;) {
    const size_t upTo = std::min<uint64_t>(u.bytes, std::max(kFirstCopyOutBytes, 2 * copied));
    if (!u.payload.reserve(upTo))
      s = systemError(
          strCat("out of memory for a message of ", u.bytes, " bytes from rank ", peer_));
    else
      s = stream_->readPeer(u.payload.data() + copied, u.remote + copied, u.remoteKey,
                            upTo - copied);
    copied = upTo;
  }
  if (!s.isOk()) {
    closeWith(s);
    return s;
  }
  queueAck(tag, u.remote, nullptr);
  u.remote = 0;
  unconfirmed_.push_back(tag);
  return Status::ok();
}

bool StreamConnection::holdsUnclaimed(std::chrono::microseconds olderThan) const {
  if (unexpectedDescriptors_ == 0) return false;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [tag, u] : unexpected_)
    if (u.remote != 0 && now - u.arrived >= olderThan) return true;
  return false;
}

Status StreamConnection::copyOutUnclaimed(std::chrono::microseconds olderThan) {
  if (!holdsUnclaimed(olderThan)) return Status::ok();
  const auto now = std::chrono::steady_clock::now();
  for (auto& [tag, u] : unexpected_) {
    if (u.remote == 0 || now - u.arrived < olderThan) continue;
    --unexpectedDescriptors_;
    BRAID_RETURN_IF_ERROR(copyOut(tag, u));
  }
  return Status::ok();
}

Result<bool> StreamConnection::pullSome() {
  size_t budget = kPullBytesPerProgress;
  bool moved = false;
  while (!pulls_.empty() && budget > 0) {
    auto it = posted_.find(pulls_.front());
    if (it == posted_.end()) {
      pulls_.pop_front();
      continue;
    }
    PostedRecv& p = it->second;
    const size_t left = p.bytes - p.copied;
    size_t n = std::min(left, budget);
    Status s;
    if (p.reduces()) {
      // Through the staging buffer, which stays in cache, in whole elements
      // (a partial one at the very end is dropped, as combineArriving does).
      const size_t unit = p.combiner.unit;
      n = std::min(n, staging_.size() / unit * unit);
      if (n < left) n = n / unit * unit;
      if (n == 0) break;
      s = stream_->readPeer(staging_.data(), p.remote + p.copied, p.remoteKey, n);
      if (s.isOk() && n >= unit)
        p.combiner.apply(p.data + p.copied, p.local + p.copied, staging_.data(), n / unit,
                         p.combiner.context);
    } else if (n > 0) {
      s = stream_->readPeer(p.data + p.copied, p.remote + p.copied, p.remoteKey, n);
    }
    if (!s.isOk()) {
      closeWith(s);
      return s;
    }
    p.copied += n;
    budget -= n;
    moved = true;
    if (p.copied < p.bytes) continue;
    // The receive completes once the ack is written, so that a caller done
    // with this connection never leaves the sender waiting for it.
    queueAck(it->first, p.remote, std::move(p.request));
    posted_.erase(it);
    pulls_.pop_front();
  }
  return moved;
}

}  // namespace braid::transport
