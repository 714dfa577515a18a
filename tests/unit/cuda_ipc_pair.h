// The two ends of a CUDA-IPC connection in this process, each with a
// stand-in device of its own (fake_ipc_device.h) and a socket pair as the
// host connection: the fixture of the cuda_ipc protocol tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <initializer_list>
#include <memory>

#include "fake_ipc_device.h"
#include "transports/cuda_ipc/cuda_ipc_connection.h"
#include "transports/stream_connection.h"
#include "transports/tcp/socket_stream.h"

namespace braid::transport::cuda_ipc {

using State = Request::State;

inline std::unique_ptr<Connection> controlEnd(int fd, int peer) {
  return std::make_unique<StreamConnection>(std::make_unique<tcp::SocketStream>(tcp::Fd(fd), peer),
                                            peer);
}

inline CudaIpcConnection::Options smallSlots(int slots = 4, size_t slotBytes = 4096) {
  CudaIpcConnection::Options o;
  o.slots = slots;
  o.slotBytes = slotBytes;
  return o;
}

class CudaIpcPair : public ::testing::Test {
 protected:
  void open(CudaIpcConnection::Options options = smallSlots()) {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    devA = std::make_shared<FakeIpcDevice>();
    devB = std::make_shared<FakeIpcDevice>();
    auto a = CudaIpcConnection::create(controlEnd(fds[0], 1), devA, options);
    auto b = CudaIpcConnection::create(controlEnd(fds[1], 0), devB, options);
    ASSERT_TRUE(a.isOk()) << a.status().message();
    ASSERT_TRUE(b.isOk()) << b.status().message();
    A = std::move(*a);
    B = std::move(*b);
  }
  void SetUp() override { open(); }

  // Drives both ends until no request is pending (or 10 s).
  void drive(std::initializer_list<RequestPtr> requests) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      if (A) (void)A->progress();
      if (B) (void)B->progress();
      bool pending = false;
      for (const auto& r : requests) pending = pending || r->state() == State::kPending;
      if (!pending) return;
    }
    ADD_FAILURE() << "requests still pending after 10 s";
  }
  void synchronize() {
    EXPECT_TRUE(devA->synchronize().isOk()) << devA->synchronize().message();
    EXPECT_TRUE(devB->synchronize().isOk()) << devB->synchronize().message();
  }

  std::shared_ptr<FakeIpcDevice> devA, devB;
  std::unique_ptr<CudaIpcConnection> A, B;
};

}  // namespace braid::transport::cuda_ipc
