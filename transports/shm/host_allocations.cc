#include "transports/shm/host_allocations.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "src/common/strcat.h"
#include "transports/tcp/socket.h"

namespace braid::shm {

namespace {

// The first page of every shared allocation.
struct AllocationHeader {
  uint64_t magic;
  uint64_t generation;
  uint64_t address;  // the first user byte, in the owner
  uint64_t bytes;    // user bytes
};
constexpr uint64_t kHeaderMagic = 0x6272616964486f73;  // "braidHos"

size_t pageBytes() {
  static const size_t bytes = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return bytes;
}

struct Owned {
  int fd;
  uint32_t generation;
  void* base;  // the header page
  size_t mappedBytes;
  size_t bytes;  // user bytes, from base + one page
};

// This process's shared allocations, by their first user byte.
struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, Owned> byAddress;
  uint32_t nextGeneration = 1;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: frees may come from atexit handlers
  return *r;
}

constexpr uint64_t kSharedBit = uint64_t{1} << 63;

}  // namespace

Result<void*> allocateShared(size_t bytes) {
  if (bytes == 0) return invalidArgument("a shared allocation needs at least one byte");
  const size_t page = pageBytes();
  if (bytes > (size_t{1} << 50)) return invalidArgument(strCat(bytes, " bytes is too large"));
  const size_t mapped = page + (bytes + page - 1) / page * page;
  tcp::Fd fd(::memfd_create("braid-host-alloc", MFD_CLOEXEC));
  if (!fd.valid()) return errnoStatus("memfd_create for a shared allocation", errno);
  if (int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(mapped)); err != 0)
    return errnoStatus(strCat("reserving ", bytes, " bytes of shared host memory"), err);
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) return errnoStatus(strCat("mapping ", bytes, " shared bytes"), errno);
  auto* user = static_cast<std::byte*>(base) + page;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const uint32_t generation = r.nextGeneration++;
  if (r.nextGeneration == 0) r.nextGeneration = 1;
  auto* header = static_cast<AllocationHeader*>(base);
  *header = {kHeaderMagic, generation, reinterpret_cast<uintptr_t>(user), bytes};
  r.byAddress[reinterpret_cast<uintptr_t>(user)] = {fd.release(), generation, base, mapped, bytes};
  return static_cast<void*>(user);
}

Status freeShared(void* data) {
  Registry& r = registry();
  Owned owned;
  {
    std::lock_guard lock(r.mutex);
    auto it = r.byAddress.find(reinterpret_cast<uintptr_t>(data));
    if (it == r.byAddress.end())
      return invalidArgument(strCat("ptr ", data, " is not an allocation of braidHostAlloc"));
    owned = it->second;
    r.byAddress.erase(it);
  }
  ::munmap(owned.base, owned.mappedBytes);
  ::close(owned.fd);
  return Status::ok();
}

std::optional<uint64_t> sharedKey(const void* data, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(data);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.byAddress.upper_bound(at);
  if (it == r.byAddress.begin()) return std::nullopt;
  --it;
  const Owned& owned = it->second;
  if (at - it->first > owned.bytes || bytes > owned.bytes - (at - it->first)) return std::nullopt;
  return kSharedBit | (static_cast<uint64_t>(owned.fd) << 32) | owned.generation;
}

PeerAllocations::Mapping::Mapping(Mapping&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PeerAllocations::Mapping& PeerAllocations::Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    if (base_) ::munmap(base_, bytes_);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PeerAllocations::Mapping::~Mapping() {
  if (base_) ::munmap(base_, bytes_);
}

Result<PeerAllocations::Mapped> PeerAllocations::map(int fd, uint32_t generation,
                                                     bool writable) const {
  const std::string path = strCat("/proc/", pid_, "/fd/", fd);
  // O_NONBLOCK: whatever the fd turned out to be, opening it never waits.
  tcp::Fd file(::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NONBLOCK));
  if (!file.valid()) {
    if (errno == ENOENT)
      return remoteError(strCat("rank ", rank_, " sent a buffer of braidHostAlloc memory that it ",
                                "has freed (", path, " is gone)"));
    return errnoStatus(strCat("opening rank ", rank_, "'s shared allocation ", path), errno);
  }
  struct stat st {};
  if (::fstat(file.get(), &st) != 0) return errnoStatus(strCat("fstat of ", path), errno);
  const size_t page = pageBytes();
  if (!S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(page))
    return remoteError(strCat("rank ", rank_, "'s ", path, " is not a shared allocation"));
  const size_t mapped = static_cast<size_t>(st.st_size);
  const int protection = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* base = ::mmap(nullptr, mapped, protection, MAP_SHARED | MAP_POPULATE, file.get(), 0);
  if (base == MAP_FAILED)
    return errnoStatus(strCat("mapping rank ", rank_, "'s shared allocation ", path), errno);
  Mapping mapping(base, mapped);
  AllocationHeader header;
  std::memcpy(&header, base, sizeof(header));
  if (header.magic != kHeaderMagic || header.bytes > mapped - page)
    return remoteError(strCat("rank ", rank_, "'s ", path, " is not a shared allocation"));
  if (header.generation != generation)
    return remoteError(strCat("rank ", rank_, " sent a buffer of braidHostAlloc memory that it ",
                              "has freed (", path, " now holds another allocation)"));
  return Mapped{fd, generation, header.address, header.bytes, writable, std::move(mapping)};
}

Result<const std::byte*> PeerAllocations::find(uint64_t address, uint64_t key, size_t bytes) {
  BRAID_ASSIGN_OR_RETURN(std::byte * at, locate(address, key, bytes, false));
  return static_cast<const std::byte*>(at);
}

Result<std::byte*> PeerAllocations::findWritable(uint64_t address, uint64_t key, size_t bytes) {
  return locate(address, key, bytes, true);
}

Result<std::byte*> PeerAllocations::locate(uint64_t address, uint64_t key, size_t bytes,
                                           bool writable) {
  if (!isSharedKey(key) || pid_ <= 0)
    return invalidArgument("not a key of a shared allocation, or no peer to read");
  const int fd = static_cast<int>((key >> 32) & 0x7fffffff);
  const auto generation = static_cast<uint32_t>(key);
  auto it =
      std::find_if(mapped_.begin(), mapped_.end(), [&](const Mapped& m) { return m.fd == fd; });
  // The fd now names another allocation (the one mapped here was freed), or
  // a write needs what was mapped for reading only.
  if (it != mapped_.end() && (it->generation != generation || (writable && !it->writable))) {
    mapped_.erase(it);
    it = mapped_.end();
  }
  if (it == mapped_.end()) {
    BRAID_ASSIGN_OR_RETURN(Mapped fresh, map(fd, generation, writable));
    mapped_.insert(mapped_.begin(), std::move(fresh));
    if (mapped_.size() > kMostMapped) mapped_.pop_back();
  } else {
    std::rotate(mapped_.begin(), it, it + 1);
  }
  const Mapped& m = mapped_.front();
  if (address < m.address || address - m.address > m.bytes ||
      bytes > m.bytes - (address - m.address))
    return remoteError(strCat("rank ", rank_, " sent a descriptor of ", bytes, " bytes at ",
                              address, " outside its shared allocation of ", m.bytes, " bytes at ",
                              m.address));
  return m.mapping.base() + pageBytes() + (address - m.address);
}

}  // namespace braid::shm
