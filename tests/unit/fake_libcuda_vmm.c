/* Virtual memory management of the stand-in CUDA driver (cuMem*): memory
 * made by cuMemCreate is a memfd, mapped by cuMemMap over an address range
 * that cuMemAddressReserve carves from the GPU memory of fake_libcuda.c, so
 * copies see it as device memory. Exporting it gives a duplicate of the
 * memfd, which another process that receives it (over a Unix socket, as
 * the driver's POSIX file descriptors travel) imports and maps: the same
 * pages, as on a GPU.
 *
 * A GPU without cuMem file descriptors is the default; FAKE_CUDA_VMM=1 in
 * the environment makes cuDeviceGetAttribute report support for both.
 */
#define _GNU_SOURCE /* memfd_create */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_libcuda_internal.h"

enum {
  GRANULARITY = 1 << 16,
  ATTRIBUTE_VMM = 102,
  ATTRIBUTE_POSIX_FD = 103,
  ATTRIBUTE_MPS_ENABLED = 133,
  HANDLE_TYPE_POSIX_FD = 1,
  ALLOCATION_PINNED = 1,
  LOCATION_DEVICE = 1,
  ACCESS_READ_WRITE = 3
};

/* cuda.h's CUmemLocation, CUmemAllocationProp and CUmemAccessDesc. */
typedef struct {
  int type;
  int id;
} FakeMemLocation;
typedef struct {
  int type;
  int requestedHandleTypes;
  FakeMemLocation location;
  void* win32HandleMetaData;
  unsigned char allocFlags[8];
} FakeMemAllocationProp;
typedef struct {
  FakeMemLocation location;
  int flags;
} FakeMemAccessDesc;

/* What a CUmemGenericAllocationHandle points to. */
typedef struct {
  int fd;
  size_t bytes;
  int exportable;
  int imported; /* another process's, from cuMemImportFromShareableHandle */
} Allocation;

static unsigned long liveAllocations, liveMaps;

/* Allocations not released, and mappings not unmapped: 0 once everything
 * is released. */
unsigned long fakeCudaLiveVmmAllocations(void) {
  return __atomic_load_n(&liveAllocations, __ATOMIC_RELAXED);
}
unsigned long fakeCudaLiveVmmMaps(void) {
  return __atomic_load_n(&liveMaps, __ATOMIC_RELAXED);
}

static int supported(void) {
  const char* vmm = getenv("FAKE_CUDA_VMM");
  return vmm != NULL && strcmp(vmm, "1") == 0;
}

int cuDeviceGetAttribute(int* value, int attribute, int device) {
  if (value == NULL || device != 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (attribute == ATTRIBUTE_MPS_ENABLED) {
    /* FAKE_CUDA_MPS=0 or 1; unset: a driver older than the attribute. */
    const char* mps = getenv("FAKE_CUDA_MPS");
    if (mps == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
    *value = strcmp(mps, "1") == 0;
    return FAKE_CUDA_SUCCESS;
  }
  if (attribute != ATTRIBUTE_VMM && attribute != ATTRIBUTE_POSIX_FD)
    return FAKE_CUDA_ERROR_INVALID_VALUE;
  *value = supported();
  return FAKE_CUDA_SUCCESS;
}

static int validProp(const FakeMemAllocationProp* prop) {
  return prop != NULL && prop->type == ALLOCATION_PINNED &&
         prop->location.type == LOCATION_DEVICE && prop->location.id == 0;
}

int cuMemGetAllocationGranularity(size_t* granularity, const FakeMemAllocationProp* prop,
                                  int flags) {
  if (granularity == NULL || !validProp(prop) || flags != 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  *granularity = GRANULARITY;
  return FAKE_CUDA_SUCCESS;
}

static unsigned long long newAllocation(int fd, size_t bytes, int exportable) {
  Allocation* a = calloc(1, sizeof(Allocation));
  if (a == NULL) return 0;
  a->fd = fd;
  a->bytes = bytes;
  a->exportable = exportable;
  __atomic_add_fetch(&liveAllocations, 1, __ATOMIC_RELAXED);
  return (unsigned long long)(uintptr_t)a;
}

int cuMemCreate(unsigned long long* handle, size_t bytes, const FakeMemAllocationProp* prop,
                unsigned long long flags) {
  if (fakeUnsafeDuringCapture()) return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (!supported()) return FAKE_CUDA_ERROR_NOT_SUPPORTED;
  if (handle == NULL || !validProp(prop) || flags != 0 || bytes == 0 || bytes % GRANULARITY != 0)
    return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (!fakeMemoryLockFree(FAKE_LOCK_ALLOCATIONS)) return FAKE_CUDA_ERROR_MEMORY_LOCK_HELD;
  const int fd = memfd_create("fake-cumem", MFD_CLOEXEC);
  if (fd < 0) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, (off_t)bytes) != 0) {
    close(fd);
    return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  }
  *handle = newAllocation(fd, bytes, (prop->requestedHandleTypes & HANDLE_TYPE_POSIX_FD) != 0);
  if (*handle == 0) {
    close(fd);
    return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  }
  return FAKE_CUDA_SUCCESS;
}

int cuMemRelease(unsigned long long handle) {
  Allocation* a = (Allocation*)(uintptr_t)handle;
  if (a == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
  close(a->fd);
  free(a);
  __atomic_sub_fetch(&liveAllocations, 1, __ATOMIC_RELAXED);
  return FAKE_CUDA_SUCCESS;
}

int cuMemAddressReserve(unsigned long long* pointer, size_t bytes, size_t alignment,
                        unsigned long long address, unsigned long long flags) {
  if (pointer == NULL || bytes == 0 || bytes % GRANULARITY != 0 || address != 0 || flags != 0)
    return FAKE_CUDA_ERROR_INVALID_VALUE;
  void* reserved = fakeCarveDeviceMemory(bytes, alignment > GRANULARITY ? alignment : GRANULARITY);
  if (reserved == NULL) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  *pointer = (unsigned long long)(uintptr_t)reserved;
  return FAKE_CUDA_SUCCESS;
}

int cuMemAddressFree(unsigned long long pointer, size_t bytes) {
  /* The arena never gives address space back. */
  return pointer != 0 && bytes != 0 ? FAKE_CUDA_SUCCESS : FAKE_CUDA_ERROR_INVALID_VALUE;
}

int cuMemMap(unsigned long long pointer, size_t bytes, size_t offset, unsigned long long handle,
             unsigned long long flags) {
  Allocation* a = (Allocation*)(uintptr_t)handle;
  if (a == NULL || flags != 0 || offset != 0 || bytes != a->bytes || pointer % GRANULARITY != 0)
    return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (!fakeMemoryLockFree(a->imported ? FAKE_LOCK_MAPPINGS : FAKE_LOCK_ALLOCATIONS))
    return FAKE_CUDA_ERROR_MEMORY_LOCK_HELD;
  if (mmap((void*)(uintptr_t)pointer, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, a->fd,
           0) == MAP_FAILED)
    return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  __atomic_add_fetch(&liveMaps, 1, __ATOMIC_RELAXED);
  return FAKE_CUDA_SUCCESS;
}

int cuMemUnmap(unsigned long long pointer, size_t bytes) {
  /* Back to plain arena pages, never handed out again. */
  if (mmap((void*)(uintptr_t)pointer, bytes, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED)
    return FAKE_CUDA_ERROR_INVALID_VALUE;
  __atomic_sub_fetch(&liveMaps, 1, __ATOMIC_RELAXED);
  return FAKE_CUDA_SUCCESS;
}

int cuMemSetAccess(unsigned long long pointer, size_t bytes, const FakeMemAccessDesc* desc,
                   size_t count) {
  if (pointer == 0 || bytes == 0 || desc == NULL || count != 1 ||
      desc->location.type != LOCATION_DEVICE || desc->location.id != 0 ||
      desc->flags != ACCESS_READ_WRITE)
    return FAKE_CUDA_ERROR_INVALID_VALUE;
  return FAKE_CUDA_SUCCESS;
}

int cuMemExportToShareableHandle(void* shareable, unsigned long long handle, int type,
                                 unsigned long long flags) {
  Allocation* a = (Allocation*)(uintptr_t)handle;
  if (shareable == NULL || a == NULL || type != HANDLE_TYPE_POSIX_FD || flags != 0 ||
      !a->exportable)
    return FAKE_CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  *(int*)shareable = fd;
  return FAKE_CUDA_SUCCESS;
}

int cuMemImportFromShareableHandle(unsigned long long* handle, void* osHandle, int type) {
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  struct stat st;
  const int given = (int)(intptr_t)osHandle;
  if (handle == NULL || type != HANDLE_TYPE_POSIX_FD || fstat(given, &st) != 0 || st.st_size <= 0)
    return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (fakeRefusesIpcOpens()) return FAKE_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  const int fd = fcntl(given, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  *handle = newAllocation(fd, (size_t)st.st_size, 1);
  if (*handle != 0) ((Allocation*)(uintptr_t)*handle)->imported = 1;
  if (*handle == 0) {
    close(fd);
    return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  }
  return FAKE_CUDA_SUCCESS;
}
