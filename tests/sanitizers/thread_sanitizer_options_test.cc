// The ThreadSanitizer build's tests run with halt_on_error=1, which is not
// ThreadSanitizer's default (tests/sanitizers/meson.build sets it): a race
// report ends the process at once. Without it a rank that raced would go on,
// and the report would count only through the exit status, which the
// failure tests do not look at for the ranks they kill or that outlive them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

namespace {

// ThreadSanitizer's exit status for a process that reported an error.
constexpr int kReportedExitStatus = 66;

// Two threads write one int with nothing ordering the writes: a race that
// ThreadSanitizer reports.
volatile int racyCell = 0;

void race() {
  std::atomic<bool> written{false};
  std::thread first([&] {
    racyCell = 1;
    written.store(true, std::memory_order_relaxed);  // relaxed: no happens-before
  });
  while (!written.load(std::memory_order_relaxed)) std::this_thread::yield();
  racyCell = 2;
  first.join();
}

TEST(ThreadSanitizerOptions, ARaceEndsTheProcessAtTheReport) {
  int pipeFds[2];
  ASSERT_EQ(::pipe(pipeFds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipeFds[0]);
    race();
    const char wentOn = 'x';  // only if the report did not end the process
    (void)!::write(pipeFds[1], &wentOn, 1);
    ::_exit(0);
  }
  ::close(pipeFds[1]);
  char byte = 0;
  const ssize_t got = ::read(pipeFds[0], &byte, 1);
  ::close(pipeFds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_EQ(got, 0) << "the process went on past a race report: TSAN_OPTIONS lacks halt_on_error=1";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kReportedExitStatus);
}

}  // namespace
