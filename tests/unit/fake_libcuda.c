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
 *
 * Forked processes can share the one GPU (fakeCudaShareArena): a region
 * the test maps shared before fork, at the same address in every process,
 * becomes the device memory of all of them, each allocating from a part of
 * its own, so that an address means the same bytes in every process, as
 * CUDA IPC's mappings do (fake_libcuda_ipc.c). Device memory is
 * fake_libcuda_memory.c's.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_libcuda_internal.h"

/* Read by braid's threads and the streams', set by the test's: accessed
 * atomically. Still, a test changes them only while nothing copies, as
 * they are not set as one. */
static uintptr_t rangeBegin, rangeEnd;
static int rangeDevice, rangeManaged;
static int rangeWithoutContext; /* the driver names no context for the range */
/* Counters: updated from braid's threads and the streams' too. copies
 * counts every copy; hostDeviceCopies those between host and GPU memory
 * (staging), deviceCopies those from GPU to GPU memory. */
static unsigned long queries;
/* Pointer queries answered with an error: what compute-sanitizer reports. */
static unsigned long failedQueries;
static unsigned long copies, waits, hostDeviceCopies, deviceCopies;
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

void* fakeContext(void) {
  return &theContext;
}

int fakeHasContext(void) {
  return contextDepth > 0 || contextCurrent;
}

/* Marks [begin, begin + bytes) as memory of GPU `device`, managed or not;
 * bytes = 0 clears it. */
/* Whether memory answers CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
 * with 1, as cudaMalloc's does (the default), or 0, as a pool's does. */
static int legacyIpcCapable = 1;
void fakeCudaSetLegacyIpcCapable(int capable) {
  WRITE(legacyIpcCapable, capable);
}

/* Whether the range's memory is reported as managed memory, the range
 * itself kept. */
void fakeCudaSetRangeManaged(int managed) {
  WRITE(rangeManaged, managed);
}

/* The GPU the range's memory is reported on, the range itself kept. */
void fakeCudaSetRangeDevice(int device) {
  WRITE(rangeDevice, device);
}

void fakeCudaSetDeviceRange(void* begin, size_t bytes, int device, int managed) {
  WRITE(rangeBegin, (uintptr_t)begin);
  WRITE(rangeEnd, (uintptr_t)begin + bytes);
  WRITE(rangeDevice, device);
  WRITE(rangeManaged, managed);
}

/* Nonzero: the range is memory of no context, as the driver says of memory
 * from cuMemCreate or from a memory pool (CU_POINTER_ATTRIBUTE_CONTEXT is
 * NULL). */
void fakeCudaRangeWithoutContext(int without) {
  WRITE(rangeWithoutContext, without);
}

/* Whether [address, address + bytes) lies in the range of GPU memory. */
static int inRange(unsigned long long address, size_t bytes) {
  const uintptr_t begin = READ(rangeBegin), end = READ(rangeEnd);
  return address >= begin && address <= end && bytes <= end - address;
}

/* How many copies to or from the range were made, and how many times a
 * context was waited for. */
unsigned long fakeCudaCopyCount(void) {
  return READ(copies);
}
unsigned long fakeCudaWaitCount(void) {
  return READ(waits);
}
/* Of those copies: the ones between host and GPU memory (cuMemcpyDtoH,
 * cuMemcpyHtoD and their Async forms), as staging makes; and the ones from
 * GPU to GPU memory (cuMemcpyAsync), as the CUDA-IPC transport makes. */
unsigned long fakeCudaHostDeviceCopyCount(void) {
  return READ(hostDeviceCopies);
}
unsigned long fakeCudaDeviceToDeviceCopyCount(void) {
  return READ(deviceCopies);
}

/* Contexts pushed and not popped: 0 between calls. */
int fakeCudaContextDepth(void) {
  return contextDepth;
}

/* Nonzero: every copy fails with CUDA_ERROR_ILLEGAL_ADDRESS. */
void fakeCudaFailCopies(int fail) {
  __atomic_store_n(&failCopies, fail, __ATOMIC_RELAXED);
}

/* Nonzero: cuPointerGetAttribute(s) answers every question with this error, as
 * the driver does with a sticky error after a faulting kernel, or once it
 * has shut down. */
static int pointerQueryError;
void fakeCudaFailPointerQueries(int error) {
  WRITE(pointerQueryError, error);
}

/* How many times cuPointerGetAttribute was called. */
unsigned long fakeCudaQueryCount(void) {
  return READ(queries);
}

/* How many pointer queries were answered with an error. */
unsigned long fakeCudaFailedPointerQueries(void) {
  return READ(failedQueries);
}

static int pointerAttribute(void* data, int attribute, unsigned long long ptr);

int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
  const int r = pointerAttribute(data, attribute, ptr);
  if (r != FAKE_CUDA_SUCCESS) BUMP(failedQueries);
  return r;
}

static int pointerAttribute(void* data, int attribute, unsigned long long ptr) {
  BUMP(queries);
  if (READ(pointerQueryError) != 0) return READ(pointerQueryError);
  if (data == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (!inRange(ptr, 1)) return FAKE_CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case FAKE_CU_POINTER_ATTRIBUTE_CONTEXT:
      *(void**)data = READ(rangeWithoutContext) ? NULL : &theContext;
      return FAKE_CUDA_SUCCESS;
    case FAKE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      /* The driver reports managed memory as device memory too. */
      *(unsigned int*)data = FAKE_CU_MEMORYTYPE_DEVICE;
      return FAKE_CUDA_SUCCESS;
    case FAKE_CU_POINTER_ATTRIBUTE_IS_MANAGED:
      /* CU_POINTER_ATTRIBUTE_IS_MANAGED is a bool in an int */
      *(int*)data = READ(rangeManaged);
      return FAKE_CUDA_SUCCESS;
    case FAKE_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *(int*)data = READ(rangeDevice);
      return FAKE_CUDA_SUCCESS;
    case FAKE_CU_POINTER_ATTRIBUTE_BUFFER_ID: {
      /* Memory cuMemAlloc did not make answers 0 here; the driver has
       * an id for every allocation. */
      const int i = fakeAllocationIndex(ptr);
      *(unsigned long long*)data =
          i < 0 ? 0 : (unsigned long long)getpid() << 32 | (unsigned)(i + 1);
      return FAKE_CUDA_SUCCESS;
    }
    case FAKE_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      /* Memory of cuMemAlloc, and the range a test sets, as cudaMalloc's
       * unless a test says otherwise. */
      *(int*)data = READ(legacyIpcCapable);
      return FAKE_CUDA_SUCCESS;
    case FAKE_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case FAKE_CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
      /* The cuMemAlloc allocation that holds it, else the whole range the
       * test set: what the driver calls the allocation. */
      unsigned long long base = READ(rangeBegin);
      size_t bytes = READ(rangeEnd) - READ(rangeBegin);
      (void)fakeAllocationRange(ptr, &base, &bytes);
      if (attribute == FAKE_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
        *(unsigned long long*)data = base;
      else
        *(size_t*)data = bytes;
      return FAKE_CUDA_SUCCESS;
    }
    default:
      return FAKE_CUDA_ERROR_INVALID_VALUE;
  }
}

/* As the driver: one answer per attribute, and for an address it does not
 * know, success with every answer zero (memory type 0: not the driver's). */
/* Nonzero: cuPointerGetAttributes answers a question of more than one
 * attribute with this error, as a driver might that cannot answer one of
 * them; one attribute at a time is still answered. */
static int batchedQueryError;
void fakeCudaFailBatchedPointerQueries(int error) {
  WRITE(batchedQueryError, error);
}

int cuPointerGetAttributes(unsigned int count, int* attributes, void** data,
                           unsigned long long ptr) {
  if (attributes == NULL || data == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (count > 1 && READ(batchedQueryError) != 0) {
    BUMP(failedQueries);
    return READ(batchedQueryError);
  }
  if (READ(pointerQueryError) != 0) {
    BUMP(queries);
    BUMP(failedQueries);
    return READ(pointerQueryError);
  }
  const int known = inRange(ptr, 1);
  for (unsigned int i = 0; i < count; ++i) {
    if (data[i] == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
    if (!known) {
      if (attributes[i] == FAKE_CU_POINTER_ATTRIBUTE_CONTEXT)
        *(void**)data[i] = NULL;
      else
        *(unsigned int*)data[i] = 0;
      continue;
    }
    const int r = cuPointerGetAttribute(data[i], attributes[i], ptr);
    if (r != FAKE_CUDA_SUCCESS) return r;
  }
  return FAKE_CUDA_SUCCESS;
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
/* Graph capture, as far as it refuses other threads' calls: a thread's
 * mode (CUstreamCaptureMode, GLOBAL = 0 until exchanged), and whether some
 * other thread captures in global mode. */
static __thread int captureMode;
static int globalCapture;

int cuThreadExchangeStreamCaptureMode(int* mode) {
  if (mode == NULL || *mode < 0 || *mode > 2) return FAKE_CUDA_ERROR_INVALID_VALUE;
  const int previous = captureMode;
  captureMode = *mode;
  *mode = previous;
  return FAKE_CUDA_SUCCESS;
}

/* From now on (on != 0) another thread "captures a graph in global mode". */
void fakeCudaSetGlobalCapture(int on) {
  __atomic_store_n(&globalCapture, on, __ATOMIC_RELAXED);
}

int fakeUnsafeDuringCapture(void) {
  return __atomic_load_n(&globalCapture, __ATOMIC_RELAXED) && captureMode != 2;
}

int cuCtxSynchronize(void) {
  if (fakeUnsafeDuringCapture()) return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (fakeStreamsWaitingOnValue(0)) return FAKE_CUDA_ERROR_WOULD_DEADLOCK;
  fakeSynchronizeStreams();
  BUMP(waits);
  return FAKE_CUDA_SUCCESS;
}

static int checkAndCount(unsigned long long device, size_t bytes, int deviceToDevice) {
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (!inRange(device, bytes)) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (__atomic_load_n(&failCopies, __ATOMIC_RELAXED)) return FAKE_CUDA_ERROR_ILLEGAL_ADDRESS;
  BUMP(copies);
  if (deviceToDevice)
    BUMP(deviceCopies);
  else
    BUMP(hostDeviceCopies);
  if (contextDepth > 0) BUMP(pushedCopies);
  return FAKE_CUDA_SUCCESS;
}

int fakeCheckCopy(unsigned long long device, size_t bytes) {
  return checkAndCount(device, bytes, 0);
}

int fakeCheckDeviceCopy(unsigned long long device, size_t bytes) {
  return checkAndCount(device, bytes, 1);
}

/* The synchronous copies run on the legacy default stream, which first
 * waits for every blocking stream: one held by a value the host has not
 * written would hang them (as cuCtxSynchronize). */
static int checkCopy(unsigned long long device, size_t bytes) {
  if (fakeStreamsWaitingOnValue(1)) return FAKE_CUDA_ERROR_WOULD_DEADLOCK;
  return fakeCheckCopy(device, bytes);
}

int cuMemcpyDtoH_v2(void* host, unsigned long long device, size_t bytes) {
  if (fakeUnsafeDuringCapture()) return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  int result = checkCopy(device, bytes);
  if (result == FAKE_CUDA_SUCCESS) memcpy(host, (const void*)(uintptr_t)device, bytes);
  return result;
}

int cuMemcpyHtoD_v2(unsigned long long device, const void* host, size_t bytes) {
  if (fakeUnsafeDuringCapture()) return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  int result = checkCopy(device, bytes);
  if (result == FAKE_CUDA_SUCCESS) memcpy((void*)(uintptr_t)device, host, bytes);
  return result;
}

/* One GPU, with one context. */
int cuInit(unsigned flags) {
  if (flags != 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  WRITE(initialized, 1);
  return FAKE_CUDA_SUCCESS;
}

int cuDeviceGetCount(int* count) {
  if (!READ(initialized)) return FAKE_CUDA_ERROR_NOT_INITIALIZED;
  *count = 1;
  return FAKE_CUDA_SUCCESS;
}

int cuDeviceGet(int* device, int ordinal) {
  if (!READ(initialized)) return FAKE_CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal != 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  *device = 0;
  return FAKE_CUDA_SUCCESS;
}

int cuDevicePrimaryCtxRetain(void** context, int device) {
  if (!READ(initialized)) return FAKE_CUDA_ERROR_NOT_INITIALIZED;
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

/* The one GPU, where a context is current. */
int cuCtxGetDevice(int* device) {
  if (device == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  *device = 0;
  return FAKE_CUDA_SUCCESS;
}

int cuCtxGetCurrent(void** context) {
  if (context == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
  *context = fakeHasContext() ? &theContext : NULL;
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
    case FAKE_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
      *text = "peer access is not supported between these two devices";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
      *text = "operation not permitted when stream is capturing";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_NOT_FOUND:
      *text = "named symbol not found";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_INVALID_HANDLE:
      *text = "invalid resource handle";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_NOT_READY:
      *text = "device not ready";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_NOT_SUPPORTED:
      *text = "operation not supported";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_MEMORY_LOCK_HELD:
      *text =
          "the stand-in driver: a call that takes the driver's memory lock, held by an "
          "application thread that waits for a stream waiting for braid (this hangs on a GPU)";
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
