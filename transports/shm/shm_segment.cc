#include "transports/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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
      linked_(std::exchange(other.linked_, false)) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    release();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    name_ = std::move(other.name_);
    linked_ = std::exchange(other.linked_, false);
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
}

Result<Segment> Segment::create(size_t bytes) {
  uint8_t random[8];
  BRAID_RETURN_IF_ERROR(randomBytes(random));
  std::string name = "/braid-" + std::to_string(::getpid()) + "-";
  for (uint8_t b : random) name += "0123456789abcdef"[b >> 4], name += "0123456789abcdef"[b & 15];
  ScopedFd fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  if (fd.get() < 0) return errnoStatus(strCat("shm_open of /dev/shm", name), errno);
  Segment segment;
  segment.name_ = name;
  segment.linked_ = true;
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
