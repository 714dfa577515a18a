#include "transports/tcp/socket_stream.h"

#include <sys/socket.h>

#include <cerrno>

#include "src/common/strcat.h"

namespace braid::tcp {

Status SocketStream::closedByPeer() const {
  return remoteError(strCat("rank ", peer_, " closed the connection (it exited or aborted)"));
}

Result<size_t> SocketStream::writeSome(const iovec* iov, int count) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = count;
  while (true) {
    ssize_t wrote = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (wrote >= 0) return static_cast<size_t>(wrote);
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET) return closedByPeer();
    return errnoStatus(strCat("send to rank ", peer_), errno);
  }
}

Result<size_t> SocketStream::readSome(void* into, size_t room) {
  while (true) {
    ssize_t got = ::recv(fd_.get(), into, room, MSG_DONTWAIT);
    if (got > 0) return static_cast<size_t>(got);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return size_t{0};
    if (got < 0 && errno == EINTR) continue;
    if (got == 0 || errno == ECONNRESET) return closedByPeer();
    return errnoStatus(strCat("recv from rank ", peer_), errno);
  }
}

void SocketStream::writeLast(const iovec* iov, int count) {
  if (!fd_.valid()) return;
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = count;
  (void)::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

void SocketStream::close() {
  // shutdown, not close: the fd number stays valid for a concurrent poll.
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
}

}  // namespace braid::tcp
