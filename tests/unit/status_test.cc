// Status and Result: the error values every layer returns.
#include "src/common/status.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <vector>

namespace {
std::atomic<long> allocations{0};
}  // namespace

// Counts every allocation of this test program. Both sides are replaced, so
// that malloc pairs with free (AddressSanitizer checks the pairing); GCC
// cannot see that the replaced operator new returns malloc's memory.
void* operator new(std::size_t bytes) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
#pragma GCC diagnostic pop

namespace braid {
namespace {

Result<size_t> bytesMoved(size_t n) {
  return n;
}

// The progress loop makes and drops a Result on every pass, so a Result that
// holds a value must not touch the heap.
TEST(Result, HoldingAValueAllocatesNothing) {
  const long before = allocations.load();
  size_t total = 0;
  for (size_t i = 0; i < 1000; ++i) {
    Result<size_t> r = bytesMoved(i);
    ASSERT_TRUE(r.isOk());
    ASSERT_TRUE(r.status().isOk());
    total += *r;
  }
  EXPECT_EQ(allocations.load() - before, 0);
  EXPECT_EQ(total, 999u * 1000u / 2);
}

TEST(Result, FromAnErrorKeepsIt) {
  Result<int> r = invalidUsage("counts differ");
  EXPECT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidUsage);
  EXPECT_EQ(r.status().message(), "counts differ");
}

// A Result made from an ok Status holds nothing: it must read as an error,
// never as success without a value.
TEST(Result, FromAnOkStatusIsAnInternalError) {
  Result<int> r = Status::ok();
  EXPECT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), ErrorCode::kInternalError);
  EXPECT_FALSE(r.status().message().empty());
}

TEST(Status, WithContextPrefixesTheMessageAndKeepsTheCode) {
  Status s = timeoutError("no progress").withContext("braidAllReduce #3");
  EXPECT_EQ(s.code(), ErrorCode::kTimeout);
  EXPECT_EQ(s.message(), "braidAllReduce #3: no progress");
  EXPECT_TRUE(Status::ok().withContext("x").isOk());
}

// A buffer too large for any allocator (a staged call's count past what a
// vector can hold, say) is out of memory, as a failed allocation is: the
// caller asked for too much, braid did not break.
TEST(CaughtAsStatus, AnAllocationTooLargeForAnyAllocatorIsOutOfMemory) {
  Status s = caughtAsStatus([]() -> Status {
    std::vector<unsigned char> staging;
    staging.resize(staging.max_size() + 1);
    return Status::ok();
  });
  EXPECT_EQ(s.code(), ErrorCode::kSystemError);
  EXPECT_NE(s.message().find("out of memory"), std::string::npos) << s.message();

  s = caughtAsStatus([]() -> Status { throw std::bad_alloc(); });
  EXPECT_EQ(s.code(), ErrorCode::kSystemError);
  EXPECT_EQ(s.message(), "out of memory");
  s = caughtAsStatus([]() -> Status { throw std::logic_error("broken"); });
  EXPECT_EQ(s.code(), ErrorCode::kInternalError);
  EXPECT_EQ(s.message(), "broken");
}

}  // namespace
}  // namespace braid
