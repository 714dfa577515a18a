// A stand-in GPU for the CUDA-IPC transport's tests: host memory as device
// memory, shared memory (POSIX shm objects, named by the handle) as IPC
// handles, and a worker thread as the stream. It runs the protocol of
// cuda_ipc_connection.h unchanged, within one process or across forked ones.
//
// It is strict where a GPU would be silently wrong: every copy and
// combination must stay inside memory of this device (allocated, or opened
// from a handle), or the device faults; an event opened from a handle is a
// mapping of the owner's counters, so a wait sees only records the owner
// really queued. `workDelay` slows the stream, so a missing wait shows up as
// a corrupt result rather than passing by luck.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "src/common/strcat.h"
#include "transports/cuda_ipc/ipc_device.h"

namespace braid::transport::cuda_ipc {

class FakeIpcDevice final : public IpcDevice {
 public:
  FakeIpcDevice() : worker_([this] { run(); }) {}
  ~FakeIpcDevice() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }

  std::chrono::microseconds workDelay{0};
  std::atomic<int> liveMappings{0};  // allocations and opened handles not yet released
  std::atomic<size_t> copies{0}, combines{0}, allocations{0}, hostAllocations{0};
  std::atomic<size_t> allocatedBytes{0};  // by allocate()
  std::atomic<size_t> events{0};          // by createEvent()
  // Memory and events no peer can open (allocateUnshared, createUnsharedEvent).
  std::atomic<size_t> unsharedAllocations{0}, unsharedBytes{0}, unsharedEvents{0};
  std::atomic<bool> failEnqueues{false};
  // exportRange answers with an error, as the driver does for memory it
  // cannot share.
  std::atomic<bool> refuseExports{false};
  std::atomic<size_t> exports{0};  // allocations exportRange exported (each once)
  // Added to every offset exportRange gives, as a peer that lied would.
  std::atomic<uint64_t> exportOffsetSkew{0};
  // allocate()'s memory is exported already, and a peer's mapping keeps it
  // alive, as braidMemAlloc's is: exportedRange answers for it, with
  // peerHoldsMemory, and exports counts none of it.
  std::atomic<bool> heldExports{false};
  // Reports the held allocation that holds `data` freed, as freeing it
  // would, while it stays allocated (a free racing with a peer's open).
  void reportHeldFreed(const void* data) {
    std::lock_guard lock(rangesMutex_);
    auto it = exportable_.upper_bound(reinterpret_cast<uintptr_t>(data));
    if (it != exportable_.begin()) heldFreed_.push_back(std::prev(it)->second.id);
  }
  // Runs before each openMemory; an error it returns is openMemory's.
  std::function<Status()> beforeOpen;
  // Runs before each allocateHost (pinning memory, which may wait long).
  std::function<void()> beforeAllocateHost;

  Result<std::unique_ptr<DeviceMemory>> allocate(size_t bytes) override {
    ++allocations;
    allocatedBytes += bytes;
    return mapNew(bytes == 0 ? 1 : bytes);
  }
  Result<std::unique_ptr<DeviceMemory>> allocateUnshared(size_t bytes) override {
    ++unsharedAllocations;
    unsharedBytes += bytes;
    return std::unique_ptr<DeviceMemory>(new Unshared(*this, bytes == 0 ? 1 : bytes));
  }
  Result<std::unique_ptr<DeviceMemory>> openMemory(const IpcHandle& handle) override {
    if (beforeOpen) BRAID_RETURN_IF_ERROR(beforeOpen());
    return mapHandle(handle);
  }
  Result<std::unique_ptr<DeviceEvent>> createEvent() override {
    ++events;
    BRAID_ASSIGN_OR_RETURN(auto memory, mapNew(sizeof(Counters)));
    return std::unique_ptr<DeviceEvent>(new Event(std::move(memory)));
  }
  Result<std::unique_ptr<DeviceEvent>> createUnsharedEvent() override {
    ++unsharedEvents;
    return std::unique_ptr<DeviceEvent>(
        new Event(std::unique_ptr<DeviceMemory>(new Unshared(*this, sizeof(Counters)))));
  }
  Result<std::unique_ptr<DeviceEvent>> openEvent(const IpcHandle& handle) override {
    BRAID_ASSIGN_OR_RETURN(auto memory, mapHandle(handle));
    return std::unique_ptr<DeviceEvent>(new Event(std::move(memory)));
  }

  // Host memory the device reaches, as pinned memory is.
  Result<std::unique_ptr<HostMemory>> allocateHost(size_t bytes) override {
    if (beforeAllocateHost) beforeAllocateHost();
    ++hostAllocations;
    return std::unique_ptr<HostMemory>(new Pinned(*this, bytes == 0 ? 1 : bytes));
  }
  // Memory from allocate() (which the tests' buffers are) exports as the
  // shared memory it is: the handle of the whole allocation, and an offset.
  Result<ExportedRange> exportRange(const void* data, size_t bytes) override {
    return lookUpExportable(data, bytes, true);
  }
  Result<ExportedRange> exportedRange(const void* data, size_t bytes) override {
    return lookUpExportable(data, bytes, false);
  }
  Result<bool> hasRun(DeviceEvent& event) override {
    Counters& c = static_cast<Event&>(event).counters();
    return c.completed.load() >= c.recorded.load();
  }

  Status enqueueCopy(void* dst, const void* src, size_t bytes) override {
    return enqueue([=, this] {
      if (!inRange(dst, bytes, "copy to") || !inRange(src, bytes, "copy from")) return;
      std::memmove(dst, src, bytes);
      ++copies;
    });
  }
  Status enqueueCombine(void* dst, const void* local, const void* incoming, size_t bytes,
                        const Combiner& combiner) override {
    return enqueue([=, this] {
      if (!inRange(dst, bytes, "combine into") || !inRange(local, bytes, "combine from") ||
          !inRange(incoming, bytes, "combine from"))
        return;
      combiner.apply(dst, local, incoming, bytes / combiner.unit, combiner.context);
      ++combines;
    });
  }
  Status enqueueRecord(DeviceEvent& event) override {
    Counters& c = static_cast<Event&>(event).counters();
    const uint64_t target = c.recorded.fetch_add(1) + 1;
    return enqueue([&c, target] {
      uint64_t done = c.completed.load();
      while (done < target && !c.completed.compare_exchange_weak(done, target)) {
      }
    });
  }
  Status enqueueWait(DeviceEvent& event) override {
    Counters& c = static_cast<Event&>(event).counters();
    const uint64_t target = c.recorded.load();
    return enqueue([&c, target, this] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (c.completed.load() < target) {
        if (std::chrono::steady_clock::now() > until) {
          fault("a wait for an event never ended");
          return;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
  }
  Status synchronize() override {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
    return fault_;
  }

 private:
  struct Counters {
    std::atomic<uint64_t> recorded{0}, completed{0};
  };
  // Shared memory; the handle names it as (pid, serial, bytes).
  class Memory final : public DeviceMemory {
   public:
    Memory(FakeIpcDevice& device, void* data, size_t bytes, std::string owned, IpcHandle handle)
        : device_(device), data_(data), bytes_(bytes), owned_(std::move(owned)), handle_(handle) {
      device_.addRange(data_, bytes_);
      if (!owned_.empty()) device_.addExportable(data_, bytes_, handle_);
      ++device_.liveMappings;
    }
    ~Memory() override {
      device_.drainBeforeFree();
      device_.removeRange(data_);
      ::munmap(data_, bytes_);
      if (!owned_.empty()) ::shm_unlink(owned_.c_str());
      --device_.liveMappings;
    }
    void* data() const override { return data_; }
    const IpcHandle& handle() const override { return handle_; }
    size_t bytes() const override { return bytes_; }

   private:
    FakeIpcDevice& device_;
    void* data_;
    size_t bytes_;
    std::string owned_;  // the shm name of memory this process allocated
    IpcHandle handle_;
  };
  // Bytes of this process alone that the device reaches.
  class OwnBytes {
   public:
    OwnBytes(FakeIpcDevice& device, size_t bytes) : device_(device), data_(new std::byte[bytes]()) {
      device_.addRange(data_.get(), bytes);
      ++device_.liveMappings;
    }
    ~OwnBytes() {
      device_.drainBeforeFree();
      device_.removeRange(data_.get());
      --device_.liveMappings;
    }
    void* data() const { return data_.get(); }

   private:
    FakeIpcDevice& device_;
    std::unique_ptr<std::byte[]> data_;
  };
  // Memory no peer opens: its handle, all zero, opens nothing.
  class Unshared final : public DeviceMemory {
   public:
    Unshared(FakeIpcDevice& device, size_t bytes) : bytes_(device, bytes) {}
    void* data() const override { return bytes_.data(); }
    const IpcHandle& handle() const override { return handle_; }

   private:
    OwnBytes bytes_;
    IpcHandle handle_;
  };
  class Pinned final : public HostMemory {
   public:
    Pinned(FakeIpcDevice& device, size_t bytes) : bytes_(device, bytes) {}
    void* data() const override { return bytes_.data(); }

   private:
    OwnBytes bytes_;
  };
  class Event final : public DeviceEvent {
   public:
    explicit Event(std::unique_ptr<DeviceMemory> memory) : memory_(std::move(memory)) {}
    const IpcHandle& handle() const override { return memory_->handle(); }
    Counters& counters() { return *static_cast<Counters*>(memory_->data()); }

   private:
    std::unique_ptr<DeviceMemory> memory_;
  };
  struct HandleFields {
    int32_t pid;
    uint32_t serial;
    uint64_t bytes;
  };
  static std::string shmName(const HandleFields& f) {
    return strCat("/braid-fake-gpu-", f.pid, "-", f.serial);
  }

  Result<std::unique_ptr<DeviceMemory>> mapNew(size_t bytes) {
    static std::atomic<uint32_t> serial{0};
    const HandleFields fields{static_cast<int32_t>(::getpid()), serial++, bytes};
    const std::string name = shmName(fields);
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {
      // Only a process with this pid made it, and this one never repeats a
      // serial: it is left by a dead process whose pid came round again.
      ::shm_unlink(name.c_str());
      fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    if (fd < 0) return errnoStatus("shm_open " + name, errno);
    void* data = MAP_FAILED;
    if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0)
      data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (data == MAP_FAILED) {
      ::shm_unlink(name.c_str());
      return errnoStatus("mapping " + name, err);
    }
    IpcHandle handle;
    std::memcpy(handle.bytes.data(), &fields, sizeof(fields));
    return std::unique_ptr<DeviceMemory>(new Memory(*this, data, bytes, name, handle));
  }
  Result<std::unique_ptr<DeviceMemory>> mapHandle(const IpcHandle& handle) {
    HandleFields fields;
    std::memcpy(&fields, handle.bytes.data(), sizeof(fields));
    const std::string name = shmName(fields);
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return errnoStatus("shm_open " + name, errno);
    void* data = ::mmap(nullptr, fields.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (data == MAP_FAILED) return errnoStatus("mmap", errno);
    return std::unique_ptr<DeviceMemory>(new Memory(*this, data, fields.bytes, "", handle));
  }

  // Freeing waits for the work queued before it, as cudaFree does: a copy
  // still queued on freed memory would otherwise run into an unmapping.
  void drainBeforeFree() { (void)synchronize(); }
  void addRange(void* data, size_t bytes) {
    std::lock_guard lock(rangesMutex_);
    ranges_[reinterpret_cast<uintptr_t>(data)] = bytes;
  }
  void removeRange(void* data) {
    std::lock_guard lock(rangesMutex_);
    ranges_.erase(reinterpret_cast<uintptr_t>(data));
    auto exportable = exportable_.find(reinterpret_cast<uintptr_t>(data));
    if (exportable == exportable_.end()) return;
    if (heldExports) heldFreed_.push_back(exportable->second.id);
    exportable_.erase(exportable);
  }
  // exportRange (export), or exportedRange (only what was exported).
  Result<ExportedRange> lookUpExportable(const void* data, size_t bytes, bool exportNow) {
    if (refuseExports) return notSupported("fake device: this memory cannot be exported");
    const auto a = reinterpret_cast<uintptr_t>(data);
    std::lock_guard lock(rangesMutex_);
    auto it = exportable_.upper_bound(a);
    if (it == exportable_.begin() || (--it, a + bytes > it->first + it->second.bytes))
      return notSupported("fake device: not memory of allocate()");
    if (heldExports) {
      ExportedRange held{it->second.handle, it->second.id, a - it->first + exportOffsetSkew};
      held.peerHoldsMemory = true;
      return held;
    }
    if (!exportNow && !it->second.exported) return notSupported("fake device: not exported yet");
    if (exportNow && !it->second.exported) {
      it->second.exported = true;
      ++exports;
    }
    return ExportedRange{it->second.handle, it->second.id, a - it->first + exportOffsetSkew};
  }
  void addExportable(void* data, size_t bytes, const IpcHandle& handle) {
    HandleFields fields;
    std::memcpy(&fields, handle.bytes.data(), sizeof(fields));
    std::lock_guard lock(rangesMutex_);
    exportable_[reinterpret_cast<uintptr_t>(data)] = {
        bytes, handle, uint64_t{static_cast<uint32_t>(fields.pid)} << 32 | fields.serial};
  }
  uint64_t heldFreedSince(uint64_t seen, const std::set<uint64_t>& named,
                          std::vector<uint64_t>& freed) override {
    std::lock_guard lock(rangesMutex_);
    if (heldFreed_.size() == seen) return seen;
    for (const uint64_t id : named)
      if (std::find(heldFreed_.begin(), heldFreed_.end(), id) != heldFreed_.end())
        freed.push_back(id);
    return heldFreed_.size();
  }
  // False (and the device faulted) when [p, p + bytes) is not this device's.
  bool inRange(const void* p, size_t bytes, const char* what) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    {
      std::lock_guard lock(rangesMutex_);
      auto it = ranges_.upper_bound(a);
      if (it != ranges_.begin() && (--it, a + bytes <= it->first + it->second)) return true;
    }
    fault(strCat(what, " memory that is not this device's (", bytes, " bytes)"));
    return false;
  }
  void fault(const std::string& what) {
    std::lock_guard lock(mutex_);
    if (fault_.isOk()) fault_ = Status(ErrorCode::kUnhandledCudaError, "fake device: " + what);
  }

  Status enqueue(std::function<void()> work) {
    if (failEnqueues) return Status(ErrorCode::kUnhandledCudaError, "fake device: enqueue refused");
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(work));
    }
    wake_.notify_all();
    return Status::ok();
  }
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto work = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      if (workDelay.count() > 0) std::this_thread::sleep_for(workDelay);
      work();
      lock.lock();
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
    }
  }

  std::mutex rangesMutex_;
  std::map<uintptr_t, size_t> ranges_;
  struct Exportable {
    size_t bytes;
    IpcHandle handle;
    uint64_t id;
    bool exported = false;
  };
  std::map<uintptr_t, Exportable> exportable_;
  std::vector<uint64_t> heldFreed_;  // ids of held exports freed, in order
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stopping_ = false;
  Status fault_;
  std::thread worker_;  // last: starts once the rest is built
};

// Bytes of device memory with a known pattern, readable once the device is
// synchronized.
struct DeviceBuffer {
  std::unique_ptr<DeviceMemory> memory;
  size_t bytes;
  DeviceBuffer(IpcDevice& device, size_t n) : bytes(n) {
    auto m = device.allocate(n);
    if (!m.isOk()) std::abort();  // the stand-in only fails when memory runs out
    memory = std::move(*m);
  }
  uint8_t* data() const { return static_cast<uint8_t*>(memory->data()); }
  void fill(uint8_t seed) {
    for (size_t i = 0; i < bytes; ++i) data()[i] = static_cast<uint8_t>(i * 13 + seed + (i >> 11));
  }
  bool holds(uint8_t seed) const {
    for (size_t i = 0; i < bytes; ++i)
      if (data()[i] != static_cast<uint8_t>(i * 13 + seed + (i >> 11))) return false;
    return true;
  }
};

}  // namespace braid::transport::cuda_ipc
