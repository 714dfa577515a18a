// A shared-memory segment in /dev/shm, mapped into two processes of one
// host. The creator makes it with a random name and hands the name to its
// peer over an authenticated socket; once the peer has mapped it, both
// unlink it, so that nothing is left behind even if a rank is killed later.
// Until then the creator holds a lock on it (flock): one that nobody holds
// is a killed creator's, and the next process that makes a segment removes
// it (removeStale), so that killed runs do not fill /dev/shm.
#pragma once

#include <cstddef>
#include <string>

#include "src/common/status.h"

namespace braid::shm {

class Segment {
 public:
  Segment() = default;
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  // Creates and maps `bytes` of zeroed memory, reserving every page up
  // front: a /dev/shm too small fails here with a message naming the fix,
  // instead of a SIGBUS at first touch.
  static Result<Segment> create(size_t bytes);
  static Result<Segment> open(const std::string& name, size_t bytes);

  // Bytes free in /dev/shm for this process now.
  static Result<size_t> freeBytes();

  // Removes this user's segments whose creator is gone (no lock held) and
  // that are older than a minute (a younger one's creator may not have
  // locked it yet); returns how many. create() runs it once a process.
  static int removeStale();

  // Removes the name; the mapping stays valid. Idempotent.
  void unlink();

  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  // Unlinks and unmaps what it holds, leaving it empty.
  void release();

  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool linked_ = false;
  int lockFd_ = -1;  // the creator's, holding the lock while the name is linked
};

}  // namespace braid::shm
