// Handing file descriptors to other processes of this host: how a peer
// gets the POSIX file descriptor of GPU memory exported with cuMem
// (cuMemExportToShareableHandle), which, unlike a legacy CUDA IPC handle,
// is a kernel object and cannot travel as bytes over a connection.
//
// The exporter keeps an FdServer: a Unix socket in the abstract namespace
// (nothing on disk to clean up after a crash) and a thread that answers
// each request with the descriptor asked for, passed with SCM_RIGHTS. A
// request names the descriptor by id and proves it may have it with the
// 16 random bytes the exporter put in the handle; the handle reaches only
// the ranks of this communicator, over its authenticated connections. A
// request from a process of another user is refused whatever it proves.
//
// Why a socket and a thread. pidfd_getfd would need no server, but it
// requires the right to ptrace the exporter, which Yama (ptrace_scope 1,
// the common default) denies between sibling processes. The control
// connections to peers are shm or tcp streams, which carry no
// descriptors. The thread only ever waits in poll(2).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "src/common/secret.h"
#include "src/common/status.h"
#include "transports/tcp/socket.h"

namespace braid::transport::cuda_ipc {

// Where and how to ask for one descriptor: fits in an IpcHandle.
struct FdTicket {
  int32_t pid = 0;  // the exporter's
  uint32_t reserved = 0;
  uint64_t server = 0;  // random: tells the exporter's servers apart
  uint64_t id = 0;      // the descriptor's, at that server
  Secret proof{};       // random, per descriptor
};

class FdServer {
 public:
  // Binds the socket and starts the thread.
  static Result<std::shared_ptr<FdServer>> start();
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  // Serves `fd` (owned from now on, closed by withdraw or with the server)
  // to whoever presents the ticket returned.
  Result<FdTicket> offer(tcp::Fd fd);
  void withdraw(uint64_t id);

 private:
  FdServer(tcp::Fd listener, tcp::Fd stop, uint64_t server);
  void serve();
  void answer(int client);

  tcp::Fd listener_, stop_;
  const uint64_t server_;
  std::mutex mutex_;
  struct Offer {
    tcp::Fd fd;
    Secret proof;
  };
  std::map<uint64_t, Offer> offers_;
  uint64_t nextId_ = 1;
  std::thread thread_;
};

// Asks the exporter's server for the descriptor of `ticket`: waits at most
// `timeoutMs` for the answer.
Result<tcp::Fd> fetchFd(const FdTicket& ticket, int timeoutMs = 10000);

// A connection to the server that `ticket` names, its sends and receives
// limited to `timeoutMs` each: what fetchFd asks over.
Result<tcp::Fd> connectToFdServer(const FdTicket& ticket, int timeoutMs);

}  // namespace braid::transport::cuda_ipc
