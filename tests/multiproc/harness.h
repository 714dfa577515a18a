// Runs a test body as N real processes, one per rank, each with its own
// communicator, and turns what happens in them into GoogleTest failures.
//
// braid state does not cross fork(), and the process that calls
// braidGetUniqueId() hosts the rendezvous, so the parent never touches braid:
// it forks the ranks first, rank 0 creates the unique id and sends its bytes
// to the parent through a pipe, and the parent relays them to the other
// ranks. Each rank then calls braidCommInitRank, runs the body, destroys its
// communicator and reports its failures through a result pipe before
// _exit(): a child never returns into GoogleTest.
//
// Inside a rank use the RANK_* macros below (GoogleTest's EXPECT_* would be
// recorded in the child's copy of GoogleTest and lost). The parent waits up
// to the timeout, SIGKILLs every rank still running after it, and reports
// each failure, crash (signal) and timeout with the rank and the last step
// the rank announced with RankContext::step().
#pragma once

#include <chrono>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "braid.h"

namespace braidtest {

struct RankContext {
  int rank = 0;
  int nranks = 0;
  // Made by the harness unless RunOptions::initComm is false; destroyed by
  // the harness after the body when not nullptr.
  braidComm_t comm = nullptr;
  braidUniqueId id{};  // the id every rank received

  // Announces what the rank is doing now: reported if it hangs or crashes.
  void step(const std::string& what);
  // Records a failure; the rank goes on. The first kMaxFailures are kept.
  void fail(const char* file, int line, const std::string& message);
  size_t failureCount() const { return failures_; }

  static constexpr size_t kMaxFailures = 30;

 private:
  friend struct RankRunner;
  int resultFd_ = -1;
  size_t failures_ = 0;
};

// The context of the rank running in this process (children only).
RankContext& currentRank();

struct RunOptions {
  // BRAID_TIMEOUT for the ranks, so that a rank whose peer hangs fails with
  // braidTimeout (and a message) before the harness kills it; 0 = unset.
  int braidTimeoutSeconds = 60;
  // Environment set in every rank before braid is called (after the above).
  std::vector<std::pair<std::string, std::string>> env;
  // Whether rank 0 creates a unique id for ctx.id (relayed to every rank).
  bool createId = true;
  // Whether the harness creates (and afterwards destroys) ctx.comm; needs createId.
  bool initComm = true;
  // A rank that exits with failures leaves the others this long to finish.
  std::chrono::seconds graceAfterFailure{20};
};

struct RankOutcome {
  int rank = 0;
  bool exited = false;    // exited normally
  int exitCode = -1;      // when exited
  int signal = 0;         // when killed by a signal
  bool timedOut = false;  // killed by the harness
  std::string lastStep;
  std::vector<std::string> failures;  // "file:line: message"
  size_t failureCount = 0;            // may exceed failures.size()
};

struct MultiProcessResult {
  std::vector<RankOutcome> ranks;
  double seconds = 0;
  bool ok() const;
};

// Runs body on nranks processes; adds a GoogleTest failure per rank that
// failed, crashed or timed out, and returns what happened.
MultiProcessResult runRanks(int nranks, std::function<void(RankContext&)> body,
                            std::chrono::seconds timeout, const RunOptions& options = {});

// Thrown by the fatal RANK_ASSERT_* macros; ends the body of the rank.
struct RankAbort {};

// Collects a failure message; records it when destroyed.
class FailureMessage {
 public:
  FailureMessage(const char* file, int line, std::string text, bool fatal)
      : file_(file), line_(line), fatal_(fatal) {
    stream_ << text;
  }
  FailureMessage(const FailureMessage&) = delete;
  ~FailureMessage() noexcept(false) {
    currentRank().fail(file_, line_, stream_.str());
    if (fatal_ && std::uncaught_exceptions() == 0) throw RankAbort{};
  }
  template <typename T>
  FailureMessage& operator<<(const T& v) {
    if (first_) stream_ << ": ";
    first_ = false;
    stream_ << v;
    return *this;
  }

 private:
  const char* file_;
  int line_;
  bool fatal_;
  bool first_ = true;
  std::ostringstream stream_;
};

template <typename A, typename B>
std::string describeNotEqual(const A& a, const B& b, const char* ta, const char* tb) {
  std::ostringstream s;
  s << "expected " << ta << " == " << tb << ", got " << a << " vs " << b;
  return s.str();
}

std::string describeResult(braidResult_t r, const std::string& call);

// Whether `text` contains `word`, ignoring case (for error messages).
bool mentions(std::string text, std::string word);
// Seconds from `start` to now.
double secondsSince(std::chrono::steady_clock::time_point start);

}  // namespace braidtest

// switch (0) case 0: default: makes each macro one statement, safe in an
// unbraced if/else of the caller.
#define BRAIDTEST_FAIL_IF_(bad, text, fatal) \
  switch (0)                                 \
  case 0:                                    \
  default:                                   \
    if (!(bad)) {                            \
    } else                                   \
      ::braidtest::FailureMessage(__FILE__, __LINE__, (text), (fatal))

#define RANK_EXPECT_TRUE(cond) BRAIDTEST_FAIL_IF_(!(cond), "expected " #cond, false)
#define RANK_ASSERT_TRUE(cond) BRAIDTEST_FAIL_IF_(!(cond), "expected " #cond, true)

#define BRAIDTEST_CMP_(a, b, fatal)                                                              \
  switch (0)                                                                                     \
  case 0:                                                                                        \
  default:                                                                                       \
    if (auto&& braidtest_a_ = (a); false) {                                                      \
    } else if (auto&& braidtest_b_ = (b); braidtest_a_ == braidtest_b_) {                        \
    } else                                                                                       \
      ::braidtest::FailureMessage(                                                               \
          __FILE__, __LINE__, ::braidtest::describeNotEqual(braidtest_a_, braidtest_b_, #a, #b), \
          (fatal))

#define RANK_EXPECT_EQ(a, b) BRAIDTEST_CMP_(a, b, false)
#define RANK_ASSERT_EQ(a, b) BRAIDTEST_CMP_(a, b, true)

// The call must return braidSuccess; records braidGetLastError() otherwise.
#define BRAIDTEST_OK_(call, fatal)                                           \
  switch (0)                                                                 \
  case 0:                                                                    \
  default:                                                                   \
    if (braidResult_t braidtest_r_ = (call); braidtest_r_ == braidSuccess) { \
    } else                                                                   \
      ::braidtest::FailureMessage(__FILE__, __LINE__,                        \
                                  ::braidtest::describeResult(braidtest_r_, #call), (fatal))

#define RANK_EXPECT_OK(call) BRAIDTEST_OK_(call, false)
#define RANK_ASSERT_OK(call) BRAIDTEST_OK_(call, true)
