// shm_segment.h: a /dev/shm segment owned by one object, handed on by move.
#include "transports/shm/shm_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

// The name of a segment made by a child that then dies without unlinking
// it, as a rank killed during init (its destructors never run).
std::string segmentOfADeadCreator() {
  int names[2];
  if (pipe(names) != 0) return "";
  const pid_t child = fork();
  if (child == 0) {
    auto segment = Segment::create(4096);
    const std::string name = segment.isOk() ? segment->name() : "";
    (void)!write(names[1], name.data(), name.size());
    _exit(0);
  }
  close(names[1]);
  char text[64] = {};
  const ssize_t got = read(names[0], text, sizeof(text) - 1);
  close(names[0]);
  waitpid(child, nullptr, 0);
  return got > 0 ? std::string(text, static_cast<size_t>(got)) : "";
}

// Sets the segment's modification time an hour back.
void age(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0) << name;
  timespec times[2];
  clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= 3600;
  times[1] = times[0];
  EXPECT_EQ(futimens(fd, times), 0);
  close(fd);
}

// What a rank killed during init left in /dev/shm is removed by the next
// process that makes a segment: no live creator holds its lock.
TEST(ShmSegment, AnOldSegmentOfADeadCreatorIsRemoved) {
  const std::string name = segmentOfADeadCreator();
  ASSERT_FALSE(name.empty());
  ASSERT_TRUE(nameExists(name));
  age(name);
  EXPECT_GE(Segment::removeStale(), 1);
  EXPECT_FALSE(nameExists(name));
}

// A live creator's segment stays, however old: its peer may map it yet.
TEST(ShmSegment, ALiveCreatorsSegmentIsKept) {
  auto segment = Segment::create(4096);
  ASSERT_TRUE(segment.isOk()) << segment.status().message();
  age(segment->name());
  Segment::removeStale();
  EXPECT_TRUE(nameExists(segment->name()));
}

// One made moments ago is kept even unlocked: its creator may not have
// taken the lock yet.
TEST(ShmSegment, AYoungSegmentIsKept) {
  const std::string name = segmentOfADeadCreator();
  ASSERT_FALSE(name.empty());
  Segment::removeStale();
  EXPECT_TRUE(nameExists(name));
  shm_unlink(name.c_str());
}

}  // namespace
}  // namespace braid::shm
