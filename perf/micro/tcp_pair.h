// Two StreamConnections joined by a TCP socket over loopback, progressed by
// hand on one thread: the transport alone, without schedule or engine.
#pragma once

#include <memory>

#include "transports/stream_connection.h"
#include "transports/tcp/socket.h"
#include "transports/tcp/socket_stream.h"

namespace braid::bench {

using braid::transport::Request;
using braid::transport::RequestPtr;
using braid::transport::StreamConnection;

struct LoopbackPair {
  std::unique_ptr<StreamConnection> a, b;
  LoopbackPair() {
    auto any = braid::tcp::SocketAddress::parse("127.0.0.1:0");
    auto listener = braid::tcp::listenOn(*any);
    auto bound = braid::tcp::SocketAddress::ofSocket(listener->get(), false);
    auto dialed = braid::tcp::connectTo(*bound, braid::Deadline::after(5));
    auto accepted = braid::tcp::acceptFrom(listener->get(), braid::Deadline::after(5));
    a = std::make_unique<StreamConnection>(
        std::make_unique<braid::tcp::SocketStream>(std::move(*dialed), 1), 1);
    b = std::make_unique<StreamConnection>(
        std::make_unique<braid::tcp::SocketStream>(std::move(*accepted), 0), 0);
  }
  void drive(const RequestPtr& x, const RequestPtr& y) {
    while (x->state() == Request::State::kPending || y->state() == Request::State::kPending) {
      (void)a->progress();
      (void)b->progress();
    }
  }
};

}  // namespace braid::bench
