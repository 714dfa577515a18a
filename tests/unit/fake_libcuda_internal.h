/* What the files of the stand-in CUDA driver share (fake_libcuda.c:
 * contexts, pointer queries and copies; fake_libcuda_memory.c: device
 * memory; fake_libcuda_streams.c: streams; fake_libcuda_ipc.c: interprocess
 * memory and events; fake_libcuda_vmm.c: cuMem memory). */
#pragma once

#include <stddef.h>

/* Values read and written by several threads (braid's, the streams', the
 * test's). */
#define BUMP(counter) __atomic_add_fetch(&(counter), 1, __ATOMIC_RELAXED)
#define READ(counter) __atomic_load_n(&(counter), __ATOMIC_RELAXED)
#define WRITE(variable, value) __atomic_store_n(&(variable), (value), __ATOMIC_RELAXED)

/* The driver API's values (cuda.h): CUresult, CUpointer_attribute,
 * CUmemorytype, CUstreamWaitValue_flags. */
enum {
  FAKE_CUDA_SUCCESS = 0,
  FAKE_CUDA_ERROR_INVALID_VALUE = 1,
  FAKE_CUDA_ERROR_OUT_OF_MEMORY = 2,
  FAKE_CUDA_ERROR_NOT_INITIALIZED = 3,
  FAKE_CUDA_ERROR_INVALID_CONTEXT = 201,
  FAKE_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
  FAKE_CUDA_ERROR_INVALID_HANDLE = 400,
  FAKE_CUDA_ERROR_NOT_FOUND = 500,
  FAKE_CUDA_ERROR_NOT_SUPPORTED = 801,
  FAKE_CUDA_ERROR_NOT_READY = 600,
  FAKE_CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  /* Not CUDA's: a call that would hang on a GPU (see cuCtxSynchronize). */
  FAKE_CUDA_ERROR_WOULD_DEADLOCK = 9001,
  /* Not CUDA's: see fakeCudaHoldMemoryLockWhileStreamsWait. */
  FAKE_CUDA_ERROR_MEMORY_LOCK_HELD = 9002,
  FAKE_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  FAKE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  FAKE_CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
  FAKE_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  FAKE_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  FAKE_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
  FAKE_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  FAKE_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
  FAKE_CU_MEMORYTYPE_DEVICE = 2,
  FAKE_CU_STREAM_NON_BLOCKING = 1,
  FAKE_CU_STREAM_WAIT_VALUE_GEQ = 0,
  FAKE_CU_STREAM_WAIT_VALUE_EQ = 1
};

/* The calls that take the driver's memory lock, by kind
 * (fakeCudaHoldMemoryLockWhileStreamsWait): allocating memory (device or
 * pinned), copies to or from pageable memory, and mapping memory another
 * process exported. */
enum { FAKE_LOCK_ALLOCATIONS = 1, FAKE_LOCK_COPIES = 2, FAKE_LOCK_MAPPINGS = 4 };

/* Entry points of one file that another calls. */
int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr);
int cuLaunchHostFunc(void* stream, void (*function)(void*), void* argument);

/* The one context. */
void* fakeContext(void);
/* Whether the calling thread has a context (pushed or current). */
int fakeHasContext(void);
/* Checks a copy between host memory and [device, device + bytes) of GPU
 * memory, made by the calling thread, and counts it. */
int fakeCheckCopy(unsigned long long device, size_t bytes);
/* The same for a copy from GPU memory to [device, device + bytes). */
int fakeCheckDeviceCopy(unsigned long long device, size_t bytes);
/* Whether [address, address + bytes) lies in the arena shared among
 * processes (fakeCudaShareArena), which every one of them maps at the same
 * address. */
int fakeInSharedArena(unsigned long long address, size_t bytes);
/* `bytes` of GPU memory aligned to `alignment` (a power of two), from the
 * arena as cuMemAlloc's, or NULL. */
void* fakeCarveDeviceMemory(size_t bytes, size_t alignment);
/* `bytes` of memory from this process's part of that arena, never freed,
 * or NULL; `shared` says whether an arena is shared (NULL then: it is
 * full). */
void* fakeSharedCarve(size_t bytes, int* shared);
/* The test hook (fake_libcuda.c) that marks [begin, begin + bytes) as GPU
 * memory, which the arena becomes. */
void fakeCudaSetDeviceRange(void* begin, size_t bytes, int device, int managed);
/* The index of the cuMemAlloc allocation holding `address` (from 0, in the
 * order made), or -1. */
int fakeAllocationIndex(unsigned long long address);
/* That allocation's base and size into *base and *bytes; 0 where none. */
int fakeAllocationRange(unsigned long long address, unsigned long long* base, size_t* bytes);
/* Whether the driver would refuse a "potentially unsafe" call (an
 * allocation, a synchronization, a query) on the calling thread now: while
 * another thread captures a graph in global mode (fakeCudaSetGlobalCapture)
 * and this thread's mode is not relaxed (cuThreadExchangeStreamCaptureMode).
 * Such calls return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED then. */
int fakeUnsafeDuringCapture(void);
/* Whether this process refuses to open other processes' memory, as a GPU
 * without peer access to the exporter's does (fakeCudaRefuseIpcOpens). */
int fakeRefusesIpcOpens(void);
/* Puts a stream in a kernel's sticky error (fake_libcuda_streams.c). */
void fakeCudaFailStream(void* stream);
/* Whether some stream (only blocking ones, if blockingOnly) is held by a
 * wait for a value. */
int fakeStreamsWaitingOnValue(int blockingOnly);
/* Whether a call of kind `call` (FAKE_LOCK_*), which takes the driver's
 * memory lock, may go ahead: always, unless fakeCudaHoldMemoryLockWhileStreamsWait
 * holds the lock for such calls (then after waiting
 * up to a second for every held stream to be let go; if not, the call
 * returns FAKE_CUDA_ERROR_MEMORY_LOCK_HELD). */
int fakeMemoryLockFree(int call);
/* Whether [host, host + bytes) is memory of cuMemHostAlloc. */
int fakeIsPinned(const void* host, size_t bytes);
/* Waits until every stream has run all it was given. */
void fakeSynchronizeStreams(void);
