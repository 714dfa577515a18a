/* A stand-in for the CUDA driver, libcuda.so.1, with the entry points braid
 * uses: cuPointerGetAttribute to ask about buffers, and the context and copy
 * calls that stage GPU buffers through host memory; and those the perf
 * tests' --mem cuda uses to pick a GPU and allocate its memory
 * (perf/cuda_buffers.h), which come from an arena that becomes the range. It answers as the driver
 * does, with one address range that a test marks as GPU memory
 * (fakeCudaSetDeviceRange): ordinary host memory standing in for device
 * memory, so copies are memcpy, checked to stay inside the range. Every
 * other address is memory the driver does not know
 * (CUDA_ERROR_INVALID_VALUE), as unregistered host memory is. Tests set the
 * range before any thread uses it. Contexts are per thread, as in CUDA.
 * Streams live in fake_libcuda_streams.c.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_libcuda_internal.h"

static uintptr_t rangeBegin, rangeEnd;
static int rangeDevice, rangeManaged;
/* Counters: updated from braid's threads and the streams' too. */
static unsigned long queries;
static unsigned long copies, waits;
/* Copies made with a context pushed, as braid stages a GPU buffer; the perf
 * tests copy in the current context instead. */
static unsigned long pushedCopies;
static int failCopies;
/* Per thread, as CUDA's current context: contexts pushed, and the one
 * context made current with cuCtxSetCurrent. */
static __thread int contextDepth, contextCurrent;
static int initialized;
/* The one context, owner of the range. */
static int theContext;

#define BUMP(counter) __atomic_add_fetch(&(counter), 1, __ATOMIC_RELAXED)
#define READ(counter) __atomic_load_n(&(counter), __ATOMIC_RELAXED)

void* fakeContext(void) {
  return &theContext;
}

int fakeHasContext(void) {
  return contextDepth > 0 || contextCurrent;
}

/* Marks [begin, begin + bytes) as memory of GPU `device`, managed or not;
 * bytes = 0 clears it. */
void fakeCudaSetDeviceRange(void* begin, size_t bytes, int device, int managed) {
  rangeBegin = (uintptr_t)begin;
  rangeEnd = rangeBegin + bytes;
  rangeDevice = device;
  rangeManaged = managed;
}

/* How many copies to or from the range were made, and how many times a
 * context was waited for. */
unsigned long fakeCudaCopyCount(void) {
  return READ(copies);
}
unsigned long fakeCudaWaitCount(void) {
  return READ(waits);
}

/* Contexts pushed and not popped: 0 between calls. */
int fakeCudaContextDepth(void) {
  return contextDepth;
}

/* Nonzero: every copy fails with CUDA_ERROR_ILLEGAL_ADDRESS. */
void fakeCudaFailCopies(int fail) {
  __atomic_store_n(&failCopies, fail, __ATOMIC_RELAXED);
}

/* How many times cuPointerGetAttribute was called. */
unsigned long fakeCudaQueryCount(void) {
  return READ(queries);
}

int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
  BUMP(queries);
  if (data == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (ptr < rangeBegin || ptr >= rangeEnd) return FAKE_CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case FAKE_CU_POINTER_ATTRIBUTE_CONTEXT:
      *(void**)data = &theContext;
      return FAKE_CUDA_SUCCESS;
    case FAKE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      /* The driver reports managed memory as device memory too. */
      *(unsigned int*)data = FAKE_CU_MEMORYTYPE_DEVICE;
      return FAKE_CUDA_SUCCESS;
    case FAKE_CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *(int*)data = rangeManaged; /* CU_POINTER_ATTRIBUTE_IS_MANAGED is a bool in an int */
      return FAKE_CUDA_SUCCESS;
    case FAKE_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *(int*)data = rangeDevice;
      return FAKE_CUDA_SUCCESS;
    default:
      return FAKE_CUDA_ERROR_INVALID_VALUE;
  }
}

int cuCtxPushCurrent_v2(void* context) {
  if (context != &theContext) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  ++contextDepth;
  return FAKE_CUDA_SUCCESS;
}

int cuCtxPopCurrent_v2(void** context) {
  if (contextDepth == 0) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  --contextDepth;
  if (context != NULL) *context = &theContext;
  return FAKE_CUDA_SUCCESS;
}

/* Waits for every stream of the context. One that waits for a value only
 * the host writes would never end if that host thread is the one waiting
 * here: the stand-in says so at once instead of hanging. */
int cuCtxSynchronize(void) {
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (fakeStreamsWaitingOnValue(0)) return FAKE_CUDA_ERROR_WOULD_DEADLOCK;
  fakeSynchronizeStreams();
  BUMP(waits);
  return FAKE_CUDA_SUCCESS;
}

int fakeCheckCopy(unsigned long long device, size_t bytes) {
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (device < rangeBegin || device + bytes > rangeEnd) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (__atomic_load_n(&failCopies, __ATOMIC_RELAXED)) return FAKE_CUDA_ERROR_ILLEGAL_ADDRESS;
  BUMP(copies);
  if (contextDepth > 0) BUMP(pushedCopies);
  return FAKE_CUDA_SUCCESS;
}

/* The synchronous copies run on the legacy default stream, which first
 * waits for every blocking stream: one held by a value the host has not
 * written would hang them (as cuCtxSynchronize). */
static int checkCopy(unsigned long long device, size_t bytes) {
  if (fakeStreamsWaitingOnValue(1)) return FAKE_CUDA_ERROR_WOULD_DEADLOCK;
  return fakeCheckCopy(device, bytes);
}

int cuMemcpyDtoH_v2(void* host, unsigned long long device, size_t bytes) {
  int result = checkCopy(device, bytes);
  if (result == FAKE_CUDA_SUCCESS) memcpy(host, (const void*)(uintptr_t)device, bytes);
  return result;
}

int cuMemcpyHtoD_v2(unsigned long long device, const void* host, size_t bytes) {
  int result = checkCopy(device, bytes);
  if (result == FAKE_CUDA_SUCCESS) memcpy((void*)(uintptr_t)device, host, bytes);
  return result;
}

/* One GPU, with one context. */
int cuInit(unsigned flags) {
  if (flags != 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  initialized = 1;
  return FAKE_CUDA_SUCCESS;
}

int cuDeviceGetCount(int* count) {
  if (!initialized) return FAKE_CUDA_ERROR_NOT_INITIALIZED;
  *count = 1;
  return FAKE_CUDA_SUCCESS;
}

int cuDeviceGet(int* device, int ordinal) {
  if (!initialized) return FAKE_CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal != 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  *device = 0;
  return FAKE_CUDA_SUCCESS;
}

int cuDevicePrimaryCtxRetain(void** context, int device) {
  if (!initialized) return FAKE_CUDA_ERROR_NOT_INITIALIZED;
  if (device != 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  *context = &theContext;
  return FAKE_CUDA_SUCCESS;
}

int cuDevicePrimaryCtxRelease_v2(int device) {
  return device == 0 ? FAKE_CUDA_SUCCESS : FAKE_CUDA_ERROR_INVALID_VALUE;
}

int cuCtxSetCurrent(void* context) {
  if (context != NULL && context != &theContext) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  contextCurrent = context != NULL;
  return FAKE_CUDA_SUCCESS;
}

/* Device memory: a bump allocator over an arena reserved at the first
 * allocation, which becomes the range of GPU memory. Freeing returns
 * nothing; a perf run allocates a few buffers per datatype. */
enum { FAKE_ARENA_BYTES = 1 << 30, FAKE_ALIGNMENT = 256 };
static unsigned char* arena;
static size_t arenaUsed;

int cuMemAlloc_v2(unsigned long long* device, size_t bytes) {
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (device == NULL || bytes == 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (arena == NULL) {
    void* memory = mmap(NULL, FAKE_ARENA_BYTES, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
    arena = memory;
    fakeCudaSetDeviceRange(arena, FAKE_ARENA_BYTES, 0, 0);
  }
  size_t rounded = (bytes + FAKE_ALIGNMENT - 1) / FAKE_ALIGNMENT * FAKE_ALIGNMENT;
  if (rounded > FAKE_ARENA_BYTES - arenaUsed) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  *device = (unsigned long long)(uintptr_t)(arena + arenaUsed);
  arenaUsed += rounded;
  return FAKE_CUDA_SUCCESS;
}

int cuMemFree_v2(unsigned long long device) {
  if (arena == NULL || device < (uintptr_t)arena || device >= (uintptr_t)arena + arenaUsed)
    return FAKE_CUDA_ERROR_INVALID_VALUE;
  return FAKE_CUDA_SUCCESS;
}

int cuGetErrorString(int error, const char** text) {
  switch (error) {
    case FAKE_CUDA_SUCCESS:
      *text = "no error";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_INVALID_VALUE:
      *text = "invalid argument";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_OUT_OF_MEMORY:
      *text = "out of memory";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_NOT_INITIALIZED:
      *text = "initialization error";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_INVALID_CONTEXT:
      *text = "invalid device context";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_ILLEGAL_ADDRESS:
      *text = "an illegal memory access was encountered";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_NOT_READY:
      *text = "device not ready";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_WOULD_DEADLOCK:
      *text =
          "the stand-in driver: a wait for every stream while one waits for a value only the "
          "host writes (this hangs on a GPU)";
      return FAKE_CUDA_SUCCESS;
    default:
      *text = NULL;
      return FAKE_CUDA_ERROR_INVALID_VALUE;
  }
}

/* For tests that cannot call in: with FAKE_CUDA_REPORT naming a directory,
 * each process writes "<copies> <copies with a context pushed>" to a file
 * named by its pid there when it exits. */
__attribute__((destructor)) static void writeReport(void) {
  const char* directory = getenv("FAKE_CUDA_REPORT");
  if (directory == NULL) return;
  char path[4096];
  snprintf(path, sizeof(path), "%s/%d", directory, (int)getpid());
  FILE* out = fopen(path, "w");
  if (out == NULL) return;
  fprintf(out, "%lu %lu\n", READ(copies), READ(pushedCopies));
  fclose(out);
}
