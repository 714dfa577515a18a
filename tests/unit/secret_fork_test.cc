// A process that forks while other threads of its own make secrets (a
// rendezvous server authenticating joiners while the launcher forks its
// ranks): the child must be able to make its own. libcrypto's locks are
// copied locked into a child forked while another thread holds one, and
// the child's first RAND_bytes or HMAC then waits forever; the ranks of
// the GPU job tests hung in init that way, one launch in a few dozen.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "src/common/secret.h"

namespace braid {
namespace {

// 0 when the child made a secret and a MAC and exited, 1 when it failed,
// 2 when it still had not after `seconds`.
int childOutcome(pid_t child, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(child, SIGKILL);
      (void)waitpid(child, nullptr, 0);
      return 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

// 0 when a secret and a MAC could be made here, 1 when not.
int makeASecret() {
  Secret secret{};
  std::array<uint8_t, 8> data{};
  const bool ok = randomBytes(secret).isOk();
  (void)hmac(secret, data);
  return ok ? 0 : 1;
}

// A single-threaded fork is the one ThreadSanitizer watches in the child
// (it stops reporting in children of multi-threaded processes): the
// child's copy of the lock that fork held must not look held to it. The
// child forks again, so the lock that the child made is also handed on.
TEST(SecretFork, AChildOfALoneThreadAndItsChildCanMakeSecrets) {
  ASSERT_EQ(makeASecret(), 0);
  const pid_t child = fork();
  if (child == 0) {
    if (makeASecret() != 0) _exit(1);
    const pid_t grandchild = fork();
    if (grandchild < 0) _exit(1);
    // exit, not _exit: a rank's process ends so, and LeakSanitizer checks
    // then what the lock's replacement left.
    if (grandchild == 0) exit(makeASecret());
    _exit(childOutcome(grandchild, 10) == 0 && makeASecret() == 0 ? 0 : 1);
  }
  ASSERT_GT(child, 0);
  EXPECT_EQ(childOutcome(child, 20), 0);
  EXPECT_EQ(makeASecret(), 0);
}

TEST(SecretFork, AChildForkedWhileOtherThreadsMakeSecretsCanMakeItsOwn) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> busy;
  for (int t = 0; t < 2; ++t)
    busy.emplace_back([&] {
      Secret secret{};
      std::array<uint8_t, 64> data{};
      while (!stop.load(std::memory_order_relaxed)) {
        (void)randomBytes(secret);
        (void)hmac(secret, data);
      }
    });
  int hung = 0, failed = 0;
  constexpr int kForks = 64;
  for (int i = 0; i < kForks && hung == 0; ++i) {
    const pid_t child = fork();
    if (child == 0) _exit(makeASecret());
    ASSERT_GT(child, 0);
    const int outcome = childOutcome(child, 10);
    hung += outcome == 2;
    failed += outcome == 1;
  }
  stop = true;
  for (auto& t : busy) t.join();
  EXPECT_EQ(hung, 0) << "a child forked while other threads made secrets hung in libcrypto";
  EXPECT_EQ(failed, 0);
}

}  // namespace
}  // namespace braid
