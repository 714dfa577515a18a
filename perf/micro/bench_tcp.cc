// One TCP connection pair over loopback, driven by hand: round-trip latency
// and one-way bandwidth of the transport alone (no schedule, no engine).
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "transports/stream_connection.h"
#include "transports/tcp/socket.h"
#include "transports/tcp/socket_stream.h"

namespace {

using braid::transport::Request;
using braid::transport::RequestPtr;
using braid::transport::StreamConnection;
using braid::transport::Tag;

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

void roundTrip(benchmark::State& state) {
  LoopbackPair pair;
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> out(bytes, 1), in(bytes);
  uint64_t tag = 0;
  for (auto _ : state) {
    ++tag;
    pair.drive(pair.a->postSend(out.data(), bytes, {tag, 0}),
               pair.b->postRecv(in.data(), bytes, {tag, 0}));
    pair.drive(pair.b->postSend(in.data(), bytes, {tag, 0}),
               pair.a->postRecv(out.data(), bytes, {tag, 0}));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * bytes));
}
BENCHMARK(roundTrip)->Arg(8)->Arg(4096)->Arg(64 << 10)->Arg(1 << 20)->Arg(16 << 20);

}  // namespace

BENCHMARK_MAIN();
