#include "transports/shm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <mutex>
#include <utility>

#include "src/common/secret.h"
#include "src/common/strcat.h"

namespace braid::shm {

namespace {

class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

Result<void*> mapShared(int fd, size_t bytes, const std::string& name) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return errnoStatus(strCat("mmap of /dev/shm", name), errno);
  return base;
}

}  // namespace

Segment::Segment(Segment&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      name_(std::move(other.name_)),
      linked_(std::exchange(other.linked_, false)),
      lockFd_(std::exchange(other.lockFd_, -1)) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    release();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    name_ = std::move(other.name_);
    linked_ = std::exchange(other.linked_, false);
    lockFd_ = std::exchange(other.lockFd_, -1);
  }
  return *this;
}

Segment::~Segment() {
  release();
}

void Segment::release() {
  unlink();
  if (base_) ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
}

void Segment::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
  if (lockFd_ >= 0) ::close(lockFd_);  // after the unlink: never an unlocked name of ours
  lockFd_ = -1;
}

int Segment::removeStale() {
  constexpr time_t kYoungSeconds = 60;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = std::string("/") + entry->d_name;
    if (!name.starts_with("/braid-")) continue;
    ScopedFd fd(::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0));
    struct stat st {};
    if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || st.st_uid != ::geteuid()) continue;
    if (::time(nullptr) - st.st_mtime < kYoungSeconds) continue;
    // Locked by a live creator, or the lock is ours to hold while unlinking.
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;
    if (::shm_unlink(name.c_str()) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

Result<Segment> Segment::create(size_t bytes) {
  static std::once_flag swept;
  std::call_once(swept, [] { (void)removeStale(); });
  uint8_t random[8];
  BRAID_RETURN_IF_ERROR(randomBytes(random));
  std::string name = "/braid-" + std::to_string(::getpid()) + "-";
  for (uint8_t b : random) name += "0123456789abcdef"[b >> 4], name += "0123456789abcdef"[b & 15];
  ScopedFd fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  if (fd.get() < 0) return errnoStatus(strCat("shm_open of /dev/shm", name), errno);
  Segment segment;
  segment.name_ = name;
  segment.linked_ = true;
  // Shared, so that a fork of this process (which shares the lock) keeps it
  // too; removeStale's exclusive lock fails while any holds it.
  if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0)
    segment.lockFd_ = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
  // posix_fallocate reserves the pages now; ftruncate alone would succeed
  // and the first write past the free space would kill the process.
  if (int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); err != 0) {
    if (err == ENOSPC)
      return Status(ErrorCode::kSystemError,
                    strCat("/dev/shm has no room for a ", bytes,
                           "-byte shared-memory segment; enlarge it (docker run --shm-size=1g, "
                           "or mount -o remount,size=1G /dev/shm), or set BRAID_SHM_BYTES lower, "
                           "or BRAID_TRANSPORT=tcp"));
    return errnoStatus(strCat("posix_fallocate of /dev/shm", name), err);
  }
  BRAID_ASSIGN_OR_RETURN(segment.base_, mapShared(fd.get(), bytes, name));
  segment.bytes_ = bytes;
  return segment;
}

Result<size_t> Segment::freeBytes() {
  struct statvfs st {};
  if (::statvfs("/dev/shm", &st) != 0) return errnoStatus("statvfs of /dev/shm", errno);
  return static_cast<size_t>(st.f_bavail) * st.f_frsize;
}

Result<Segment> Segment::open(const std::string& name, size_t bytes) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos)
    return invalidArgument(strCat("bad shared-memory segment name '", name, "'"));
  ScopedFd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600));
  if (fd.get() < 0) return errnoStatus(strCat("shm_open of /dev/shm", name), errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errnoStatus("fstat of a shared-memory segment", errno);
  if (static_cast<size_t>(st.st_size) != bytes)
    return invalidArgument(strCat("/dev/shm", name, " holds ", st.st_size, " bytes, not ", bytes));
  Segment segment;
  segment.name_ = name;
  segment.linked_ = true;
  BRAID_ASSIGN_OR_RETURN(segment.base_, mapShared(fd.get(), bytes, name));
  segment.bytes_ = bytes;
  return segment;
}

}  // namespace braid::shm
