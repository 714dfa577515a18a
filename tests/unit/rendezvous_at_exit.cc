// A process that exits while its rendezvous server still waits for ranks (a
// job that never formed), run as a fresh process by the test
// RendezvousServer.StopsAtExitBeforeLibcryptoCleansUp: a silent stranger and
// one of two ranks have connected when main returns. libcrypto's exit-time cleanup runs its
// handlers newest first, so the check registered here before the server
// started runs after braid's, and tells by the exit code what it saw.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "src/bootstrap.h"

namespace braid {
namespace {

enum Outcome : int {
  kStoppedAndTold = 0,
  kSetupFailed = 1,
  kServerStillRunning = 2,
  kRankNotTold = 3,
  kCheckNeverRan = 4,
};

// -1 while the rank still waits; then 1 if it was told the rendezvous ended.
std::atomic<int> rankTold{-1};

void checkOnceServersStopped() {
  if (!awaitRendezvousServers(Deadline::after(0))) ::_exit(kServerStillRunning);
  const auto start = std::chrono::steady_clock::now();
  while (rankTold.load() < 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::_exit(rankTold.load() == 1 ? kStoppedAndTold : kRankNotTold);
}

int run() {
  if (!beforeCryptoCleanup(checkOnceServersStopped).isOk()) return kSetupFailed;
  RendezvousInfo info;
  info.secret.fill(0x3c);
  auto loopback = tcp::SocketAddress::parse("127.0.0.1:0");
  if (!loopback.isOk()) return kSetupFailed;
  auto root = startRendezvousServer(*loopback, info.secret, 60);
  if (!root.isOk()) return kSetupFailed;
  info.root = *root;
  // Open through the exit (never destroyed: no destructor may close them
  // first): the stranger says nothing, the rank waits for the others.
  auto* stranger = new Result<tcp::Fd>(tcp::connectTo(info.root, Deadline::after(5)));
  auto* client =
      new Result<RendezvousClient>(RendezvousClient::connect(info, 0, Deadline::after(5)));
  if (!stranger->isOk() || !client->isOk()) return kSetupFailed;
  std::thread([client] {
    auto table = (*client)->exchange(2, "rank-0", Deadline::after(20));
    rankTold.store(!table.isOk() && table.status().code() == ErrorCode::kRemoteError &&
                           table.status().message().find("rendezvous") != std::string::npos
                       ? 1
                       : 0);
  }).detach();
  return kCheckNeverRan;  // the check, run at the exit, ends the process first
}

}  // namespace
}  // namespace braid

int main() {
  return braid::run();
}
