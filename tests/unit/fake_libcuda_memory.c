/* The stand-in CUDA driver's device memory (fake_libcuda.c says what the
 * stand-in is): the arena its allocations are carved from, which may be
 * shared among forked processes, and the record of cuMemAlloc's
 * allocations that pointer queries and cuMemGetAddressRange answer from. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include "fake_libcuda_internal.h"

/* Device memory: a bump allocator over an arena, which becomes the range
 * of GPU memory: one of this process reserved at the first allocation, or
 * the region shared among forked processes (fakeCudaShareArena). Freeing
 * returns nothing; a perf run allocates a few buffers per datatype. The
 * allocator serves braid's threads and the test's at once. */
enum { FAKE_ARENA_BYTES = 1 << 30, FAKE_ALIGNMENT = 256 };
static pthread_mutex_t arenaLock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char* arena;
static size_t arenaBytes, arenaFirst, arenaUsed;
/* The shared region, [sharedBegin, sharedEnd), or 0 and 0: set by
 * fakeCudaShareArena, read by the IPC calls' threads. */
static uintptr_t sharedBegin, sharedEnd;

/* Makes [base, base + bytes), mapped MAP_SHARED before fork at the same
 * address in every process, the memory of GPU 0 in this process, with its
 * allocations made from base + firstAllocation on: each process its own
 * part, the test keeping the parts apart (an allocation may run up to the
 * region's end). While it is set, memory and events in it are shared with
 * the other processes (fake_libcuda_ipc.c). base NULL ends the sharing and
 * clears the range; memory of a private arena made earlier is no longer
 * GPU memory either way. */
void fakeCudaShareArena(void* base, size_t bytes, size_t firstAllocation) {
  pthread_mutex_lock(&arenaLock);
  if (base == NULL) {
    arena = NULL;
    arenaBytes = arenaFirst = arenaUsed = 0;
    WRITE(sharedBegin, 0);
    WRITE(sharedEnd, 0);
    fakeCudaSetDeviceRange(NULL, 0, 0, 0);
  } else {
    arena = base;
    arenaBytes = bytes;
    /* Past the end: every allocation fails, as on a full GPU. */
    arenaFirst = arenaUsed = firstAllocation < bytes ? firstAllocation : bytes;
    WRITE(sharedBegin, (uintptr_t)base);
    WRITE(sharedEnd, (uintptr_t)base + bytes);
    fakeCudaSetDeviceRange(base, bytes, 0, 0);
  }
  pthread_mutex_unlock(&arenaLock);
}

int fakeInSharedArena(unsigned long long address, size_t bytes) {
  const uintptr_t begin = READ(sharedBegin), end = READ(sharedEnd);
  return begin != 0 && address >= begin && address <= end && bytes <= end - address;
}

/* `bytes` of the arena aligned to `alignment` (a power of two), or NULL. */
static void* carve(size_t bytes, size_t alignment, int sharedOnly) {
  void* carved = NULL;
  pthread_mutex_lock(&arenaLock);
  if (arena == NULL && !sharedOnly) {
    void* memory = mmap(NULL, FAKE_ARENA_BYTES, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory != MAP_FAILED) {
      arena = memory;
      arenaBytes = FAKE_ARENA_BYTES;
      arenaFirst = arenaUsed = 0;
      fakeCudaSetDeviceRange(arena, FAKE_ARENA_BYTES, 0, 0);
    }
  }
  if (arena != NULL && (!sharedOnly || READ(sharedBegin) != 0)) {
    const size_t start = (arenaUsed + alignment - 1) & ~(alignment - 1);
    const size_t rounded = (bytes + alignment - 1) & ~(alignment - 1);
    if (start <= arenaBytes && rounded <= arenaBytes - start) {
      carved = arena + start;
      arenaUsed = start + rounded;
    }
  }
  pthread_mutex_unlock(&arenaLock);
  return carved;
}

void* fakeCarveDeviceMemory(size_t bytes, size_t alignment) {
  return carve(bytes, alignment, 0);
}

void* fakeSharedCarve(size_t bytes, int* shared) {
  *shared = READ(sharedBegin) != 0;
  /* A cache line each: states polled by one process and written by another
   * do not share one. */
  return *shared ? carve(bytes, 64, 1) : NULL;
}

/* The allocations cuMemAlloc made in this process, for
 * cuMemGetAddressRange and CU_POINTER_ATTRIBUTE_BUFFER_ID; ids from 1. */
#define FAKE_MAX_ALLOCATIONS 4096
static struct {
  uintptr_t base;
  size_t bytes;
} allocations[FAKE_MAX_ALLOCATIONS];
static int allocationCount;

static void noteAllocation(void* memory, size_t bytes) {
  pthread_mutex_lock(&arenaLock);
  if (allocationCount < FAKE_MAX_ALLOCATIONS) {
    allocations[allocationCount].base = (uintptr_t)memory;
    allocations[allocationCount].bytes = bytes;
    ++allocationCount;
  }
  pthread_mutex_unlock(&arenaLock);
}

/* The index of the allocation holding `address`, or -1. */
int fakeAllocationIndex(unsigned long long address) {
  int found = -1;
  pthread_mutex_lock(&arenaLock);
  for (int i = allocationCount - 1; i >= 0 && found < 0; --i)
    if (address >= allocations[i].base && address - allocations[i].base < allocations[i].bytes)
      found = i;
  pthread_mutex_unlock(&arenaLock);
  return found;
}

/* The allocation holding `address` into *base and *bytes; 0 where none. */
int fakeAllocationRange(unsigned long long address, unsigned long long* base, size_t* bytes) {
  const int i = fakeAllocationIndex(address);
  if (i < 0) return 0;
  pthread_mutex_lock(&arenaLock);
  *base = allocations[i].base;
  *bytes = allocations[i].bytes;
  pthread_mutex_unlock(&arenaLock);
  return 1;
}

int cuMemGetAddressRange_v2(unsigned long long* base, size_t* size, unsigned long long ptr) {
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  const int i = fakeAllocationIndex(ptr);
  if (i < 0) return FAKE_CUDA_ERROR_NOT_FOUND;
  if (base != NULL) *base = allocations[i].base;
  if (size != NULL) *size = allocations[i].bytes;
  return FAKE_CUDA_SUCCESS;
}

int cuMemAlloc_v2(unsigned long long* device, size_t bytes) {
  if (fakeUnsafeDuringCapture()) return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (device == NULL || bytes == 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (!fakeMemoryLockFree(FAKE_LOCK_ALLOCATIONS)) return FAKE_CUDA_ERROR_MEMORY_LOCK_HELD;
  void* memory = carve(bytes, FAKE_ALIGNMENT, 0);
  if (memory == NULL) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  noteAllocation(memory, bytes);
  *device = (unsigned long long)(uintptr_t)memory;
  return FAKE_CUDA_SUCCESS;
}

int cuMemFree_v2(unsigned long long device) {
  if (fakeUnsafeDuringCapture()) return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  pthread_mutex_lock(&arenaLock);
  const int known = arena != NULL && device >= (uintptr_t)(arena + arenaFirst) &&
                    device < (uintptr_t)(arena + arenaUsed);
  pthread_mutex_unlock(&arenaLock);
  return known ? FAKE_CUDA_SUCCESS : FAKE_CUDA_ERROR_INVALID_VALUE;
}
