// shm_segment.h: a /dev/shm segment owned by one object, handed on by move.
#include "transports/shm/shm_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace braid::shm {
namespace {

bool nameExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

// A segment moved over a live one releases the live one (its name and
// mapping) once and takes the other's. Before, the assignment ran the
// destructor on itself and then assigned to the destroyed name, whose
// freed buffer the moved-from segment freed again.
TEST(ShmSegment, MovedOverALiveOneReleasesItOnceAndTakesTheOther) {
  auto first = Segment::create(4096);
  auto second = Segment::create(8192);
  ASSERT_TRUE(first.isOk()) << first.status().message();
  ASSERT_TRUE(second.isOk()) << second.status().message();
  const std::string firstName = first->name(), secondName = second->name();
  void* secondBase = second->base();
  static_cast<char*>(secondBase)[100] = 7;
  *first = std::move(*second);
  EXPECT_FALSE(nameExists(firstName)) << "the segment moved over was not unlinked";
  EXPECT_TRUE(nameExists(secondName));
  EXPECT_EQ(first->name(), secondName);
  EXPECT_EQ(first->base(), secondBase);
  EXPECT_EQ(first->bytes(), 8192u);
  EXPECT_EQ(static_cast<char*>(first->base())[100], 7);
  EXPECT_EQ(second->base(), nullptr);

  Segment third(std::move(*first));
  EXPECT_EQ(third.name(), secondName);
  EXPECT_EQ(first->base(), nullptr);
  third.unlink();
  EXPECT_FALSE(nameExists(secondName));
}

}  // namespace
}  // namespace braid::shm
