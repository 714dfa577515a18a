// Host memory that the other ranks of a host read in place (braidHostAlloc).
//
// A large message between two ranks of one host crosses in one copy, read
// from the sender's buffer with process_vm_readv (shm_stream.h). That call
// pins and copies page by page in the kernel: on the hosts measured it ran
// at 3.5-5.5 GB/s where memcpy ran at 9-10 GB/s, both ranks copying at
// once. Memory the sender allocated here lives in a memfd of its own, which
// a peer opens once through /proc/<pid>/fd/<fd> (the permission it needs is
// ptrace's read access, less than process_vm_readv's) and maps, then reads
// with memcpy at memory speed.
//
// Each memfd starts with a header page that holds what a peer checks before
// it trusts the mapping: the allocation's address in its owner, its size,
// and a generation number that no other allocation of the process has. The
// key a descriptor carries (ByteStream::peerReadKey) names the fd and the
// generation, so a peer that mapped an allocation the owner has since freed
// (and whose fd number and address a new allocation took) sees the
// generation differ and maps the new one, never reading stale bytes.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "src/common/status.h"

namespace braid::shm {

// Allocates `bytes` (> 0) of zeroed, page-aligned host memory that ranks of
// this host can map. Every page is reserved now, so memory that is short
// fails here rather than with a SIGBUS at first touch.
Result<void*> allocateShared(size_t bytes);

// Frees what allocateShared returned. Peers that mapped it keep its pages
// until they next read an allocation of this process under the same fd, or
// until their connection closes; a call in flight must not use it.
Status freeShared(void* data);

// The key under which a peer reads [data, data + bytes), or nothing when
// that range is not inside one shared allocation of this process. Keys have
// bit 63 set; the fd is in bits 32-62, the generation in bits 0-31.
std::optional<uint64_t> sharedKey(const void* data, size_t bytes);

inline bool isSharedKey(uint64_t key) {
  return (key >> 63) != 0;
}

// One peer's shared allocations, mapped into this process on first use.
class PeerAllocations {
 public:
  PeerAllocations() = default;
  PeerAllocations(PeerAllocations&&) noexcept = default;
  PeerAllocations& operator=(PeerAllocations&&) noexcept = default;
  ~PeerAllocations() = default;

  // The peer's process, whose memfds are opened through /proc; `rank` names
  // it in errors.
  void setPeer(pid_t pid, int rank) {
    pid_ = pid;
    rank_ = rank;
    mapped_.clear();
  }

  // Where [address, address + bytes) of the peer's allocation under `key`
  // (a shared key) is mapped here. Errors: the key names no live allocation
  // of the peer (it was freed), or the range is not inside it.
  Result<const std::byte*> find(uint64_t address, uint64_t key, size_t bytes);
  // The same, mapped for writing (a push into the peer's receive buffer).
  Result<std::byte*> findWritable(uint64_t address, uint64_t key, size_t bytes);

  // How many of the peer's allocations are mapped here now.
  size_t mappedCount() const { return mapped_.size(); }

 private:
  class Mapping {
   public:
    Mapping(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
    Mapping(Mapping&& other) noexcept;
    Mapping& operator=(Mapping&& other) noexcept;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping();
    std::byte* base() const { return static_cast<std::byte*>(base_); }

   private:
    void* base_ = nullptr;
    size_t bytes_ = 0;
  };
  struct Mapped {
    int fd;
    uint32_t generation;
    uint64_t address;  // the allocation's first user byte, in the peer
    uint64_t bytes;    // its user bytes
    bool writable;
    Mapping mapping;  // the whole memfd, header page first
  };
  Result<Mapped> map(int fd, uint32_t generation, bool writable) const;
  Result<std::byte*> locate(uint64_t address, uint64_t key, size_t bytes, bool writable);

  // Most recently used first; at most kMostMapped, so that allocations the
  // peer freed are let go even if their fd is never reused.
  static constexpr size_t kMostMapped = 8;
  std::vector<Mapped> mapped_;
  pid_t pid_ = 0;
  int rank_ = -1;
};

}  // namespace braid::shm
