// StreamConnection's descriptor path: a large payload in memory the peer
// can read (process_vm_readv, an RDMA read) is sent as a descriptor, its
// address and key; the receiver copies it straight out of the sender's
// buffer and acks, and the send completes on the ack.
#include <algorithm>

#include "src/common/log.h"
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
// Where a push may split a payload: a multiple of this from its start.
constexpr size_t kPushAlign = 4096;
}  // namespace

void StreamConnection::ackArrived() {
  for (auto it = awaitingAck_.begin(); it != awaitingAck_.end(); ++it)
    if (it->header.tag == header_.check && it->header.remote == header_.remote) {
      // The receiver has all of it: a push still going (only a broken peer
      // acks first) must not read a buffer its caller now has back.
      std::erase_if(pushes_, [&](const Push& p) { return p.tag == header_.check; });
      it->request->complete();
      awaitingAck_.erase(it);
      return;
    }
}

void StreamConnection::descriptorArrived() {
  const Tag arrived{header_.tag, header_.check};
  latestArrived_.arrived(header_.tag);
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
  queueControl({kAckTag, tag, 0, remote, 0}, std::move(request));
}

void StreamConnection::queueControl(const FrameHeader& header, RequestPtr request) {
  // Ahead of every frame not yet begun: the peer waits on it.
  auto at = sends_.begin();
  if (at != sends_.end() && at->sent > 0) ++at;
  sends_.insert(at, {header, nullptr, 0, std::move(request)});
  sendsPending_ = true;
}

bool StreamConnection::askForPushes() {
  if (options_.pushBytes == 0 || pulls_.empty() || !stream_->canWritePeer()) return false;
  bool asked = false;
  for (uint64_t tag : pulls_) {
    auto it = posted_.find(tag);
    if (it == posted_.end()) continue;
    PostedRecv& p = it->second;
    if (p.asked) continue;
    p.asked = true;
    // A reduction needs this rank's operand, which the sender cannot read.
    if (p.reduces() || p.bytes < options_.pushBytes || p.copied > 0) continue;
    const uint64_t targetKey = stream_->peerReadKey(p.data, p.bytes).value_or(0);
    if (!stream_->pushSpeedsUp(p.remoteKey, targetKey)) continue;
    // Halves on a page boundary: neither end then touches the other's pages.
    p.split = p.bytes / 2 / kPushAlign * kPushAlign;
    if (p.split == 0) continue;
    p.awaitingPushed = true;
    queueControl({kPushTag, tag, p.split, reinterpret_cast<uintptr_t>(p.data), targetKey}, nullptr);
    asked = true;
  }
  return asked;
}

void StreamConnection::pushRequested() {
  const FrameHeader& h = header_;
  uint64_t descriptor = 0;  // the payload's address here, which the answer names
  for (const PendingSend& s : awaitingAck_) {
    if (s.header.tag != h.check || s.header.remote == 0) continue;
    descriptor = s.header.remote;
    // A push this end cannot do, or one past its payload (a broken peer),
    // is answered at once with nothing written: the receiver copies it all.
    if (!stream_->canWritePeer() || pushRefused_ || h.bytes > s.header.bytes) break;
    pushes_.push_back({h.check, s.header.remote, s.data + h.bytes, h.remote + h.bytes, h.key,
                       static_cast<size_t>(s.header.bytes - h.bytes), 0, s.request});
    return;
  }
  queueControl({kPushedTag, h.check, 0, descriptor, 0}, nullptr);
}

void StreamConnection::pushAnswered() {
  const FrameHeader& h = header_;
  auto it = posted_.find(h.check);
  if (it == posted_.end() || !it->second.awaitingPushed || it->second.remote != h.remote ||
      h.bytes > it->second.bytes - it->second.split) {
    closeWith(remoteError(strCat("rank ", peer_, " answered a push that was not asked for")));
    return;
  }
  PostedRecv& p = it->second;
  p.awaitingPushed = false;
  p.pushed = h.bytes;
  // Its head copied, the receive waits out of pulls_; its rest is copied now.
  if (p.copied == p.split) pulls_.push_back(h.check);
}

Result<bool> StreamConnection::pushSome() {
  size_t budget = kPullBytesPerProgress;
  bool moved = false;
  while (!pushes_.empty() && budget > 0) {
    Push& push = pushes_.front();
    const size_t n = std::min(push.bytes - push.done, budget);
    if (n > 0) {
      if (Status s = stream_->writePeer(push.to + push.done, push.toKey, push.from + push.done, n);
          !s.isOk()) {
        // The receiver copies what is not written; a peer that is gone
        // fails the connection through the stream, as any other.
        if (!pushRefused_)
          BRAID_INFO("writing into rank ", peer_, "'s memory failed (", s.message(),
                     "); it copies the whole of each message from now on");
        pushRefused_ = true;
        push.bytes = push.done;
      } else {
        push.done += n;
        budget -= n;
        moved = true;
        if (push.request) push.request->noteProgress();
      }
    }
    if (push.done < push.bytes) continue;
    queueControl({kPushedTag, push.tag, push.done, push.remote, 0}, nullptr);
    pushes_.pop_front();
    moved = true;
  }
  return moved;
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

std::chrono::microseconds StreamConnection::sleepAtMost() const {
  std::lock_guard lock(mutex_);
  auto least = Connection::sleepAtMost();
  if (unexpectedDescriptors_ == 0) return least;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [tag, u] : unexpected_)
    if (u.remote != 0)
      least = std::min(least, std::max(std::chrono::microseconds(0),
                                       std::chrono::duration_cast<std::chrono::microseconds>(
                                           u.arrived + options_.unclaimedDescriptorWait - now)));
  return least;
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
    if (p.split > 0 && p.copied == p.split) {
      if (p.awaitingPushed) {
        // The head is in; the receive waits for the sender's answer.
        pulls_.pop_front();
        continue;
      }
      p.copied += p.pushed;
      p.split = 0;
    }
    const size_t end = p.split > 0 ? p.split : p.bytes;
    const size_t left = end - p.copied;
    size_t n = std::min(left, budget);
    Status s;
    if (p.reduces()) {
      // In whole elements (a partial one at the very end is dropped, as
      // combineArriving does): straight from the peer's memory where this
      // end maps it, else through the staging buffer, which stays in cache.
      const size_t unit = p.combiner.unit;
      Result<const std::byte*> inPlace =
          stream_->peerBytesInPlace(p.remote + p.copied, p.remoteKey, n);
      if (inPlace.isOk() && *inPlace == nullptr) n = std::min(n, staging_.size() / unit * unit);
      if (n < left) n = n / unit * unit;
      if (n == 0) break;
      const void* operand = staging_.data();
      if (!inPlace.isOk())
        s = inPlace.status();
      else if (*inPlace != nullptr)
        operand = *inPlace;
      else
        s = stream_->readPeer(staging_.data(), p.remote + p.copied, p.remoteKey, n);
      if (s.isOk() && n >= unit)
        p.combiner.apply(p.data + p.copied, p.local + p.copied, operand, n / unit,
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
    p.request->noteProgress();
    if (p.copied < p.bytes || p.awaitingPushed) continue;
    // The receive completes once the ack is written, so that a caller done
    // with this connection never leaves the sender waiting for it.
    queueAck(it->first, p.remote, std::move(p.request));
    posted_.erase(it);
    pulls_.pop_front();
  }
  return moved;
}

}  // namespace braid::transport
