#include "transports/loopback/loopback_connection.h"

#include <cstring>

#include "src/common/strcat.h"

namespace braid::transport {

void LoopbackConnection::match(Side& send, Side& recv) {
  if (send.bytes != recv.bytes || send.check != recv.check) {
    Status s = invalidUsage(strCat("send to self of ", send.bytes,
                                   " bytes does not match receive of ", recv.bytes, " bytes"));
    send.request->fail(s);
    recv.request->fail(s);
    return;
  }
  if (send.bytes && recv.combiner.apply)
    recv.combiner.apply(recv.data, recv.local, send.data, send.bytes / recv.combiner.unit,
                        recv.combiner.context);
  else if (send.bytes)
    std::memmove(recv.data, send.data, send.bytes);
  send.request->complete();
  recv.request->complete();
}

RequestPtr LoopbackConnection::postSend(const void* data, size_t bytes, Tag tag) {
  auto request = std::make_shared<Request>();
  Side side{const_cast<void*>(data), bytes, tag.check, request};
  std::lock_guard lock(mutex_);
  if (auto it = recvs_.find(tag.value); it != recvs_.end()) {
    match(side, it->second);
    recvs_.erase(it);
  } else {
    sends_.emplace(tag.value, side);
  }
  return request;
}

RequestPtr LoopbackConnection::postRecv(void* data, size_t bytes, Tag tag) {
  return postRecvReduce(data, nullptr, bytes, tag, {});
}

RequestPtr LoopbackConnection::postRecvReduce(void* dst, const void* local, size_t bytes, Tag tag,
                                              const Combiner& combiner) {
  auto request = std::make_shared<Request>();
  Side side{dst, bytes, tag.check, request, local, combiner};
  std::lock_guard lock(mutex_);
  if (auto it = sends_.find(tag.value); it != sends_.end()) {
    match(it->second, side);
    sends_.erase(it);
  } else {
    recvs_.emplace(tag.value, side);
  }
  return request;
}

void LoopbackConnection::abort(const Status& reason) {
  std::lock_guard lock(mutex_);
  for (auto& [t, s] : sends_) s.request->fail(reason);
  for (auto& [t, r] : recvs_) r.request->fail(reason);
  sends_.clear();
  recvs_.clear();
}

}  // namespace braid::transport
