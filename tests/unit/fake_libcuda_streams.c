/* Streams of the stand-in CUDA driver: each a thread that runs what it is
 * given in order, as a GPU runs a stream's work. Work is host functions
 * (cuLaunchHostFunc), waits for a 32-bit value (cuStreamWaitValue32),
 * asynchronous copies (checked when queued, as the driver validates its
 * arguments), and "kernels": functions a test queues with
 * fakeCudaLaunchKernel to stand for GPU work before and after a call. Host
 * memory from cuMemHostAlloc is ordinary memory, its device address itself.
 * fakeCudaFailStream puts a stream in the state of a faulted kernel: what is
 * queued after is dropped, and queries return the error, as CUDA's sticky
 * errors do.
 */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_libcuda_internal.h"

enum { WORK_FUNCTION, WORK_WAIT_VALUE, WORK_COPY };

typedef struct Work {
  int kind;
  void (*function)(void*);
  void* argument;
  const volatile uint32_t* address;
  uint32_t value;
  unsigned waitFlags; /* CU_STREAM_WAIT_VALUE_GEQ or _EQ */
  void* destination;
  const void* source;
  size_t bytes;
  struct Work* next;
} Work;

/* cuda.h's CUstreamWaitValue_flags: GEQ passes once (int32_t)(*address -
 * value) >= 0, EQ only while *address == value. */
static int waitPasses(const Work* w) {
  const uint32_t seen = __atomic_load_n(w->address, __ATOMIC_ACQUIRE);
  if (w->waitFlags == FAKE_CU_STREAM_WAIT_VALUE_EQ) return seen == w->value;
  return (int32_t)(seen - w->value) >= 0;
}

typedef struct FakeStream {
  unsigned flags;
  pthread_t thread;
  Work *head, *tail;
  int running; /* a work item is being run */
  int stop;
  int failed;  /* the sticky error, or 0 */
  int capture; /* CUstreamCaptureStatus: set by fakeCudaSetStreamCapture */
  struct FakeStream* nextStream;
} FakeStream;

/* One lock for every stream: the stand-in is about order, not speed. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static FakeStream* streams;
/* While set, every stream holds its next copy back (fakeCudaStallCopies). */
static int stallCopies;

/* Copies on every stream wait while `stall` is set: a GPU whose copies do
 * not run, as where braid's copy stream shares a hardware queue with a
 * stream that waits for the call. */
void fakeCudaStallCopies(int stall) {
  __atomic_store_n(&stallCopies, stall, __ATOMIC_RELAXED);
}

static void pause50us(void) {
  struct timespec delay = {0, 50000};
  nanosleep(&delay, NULL);
}

static void* runStream(void* argument) {
  FakeStream* s = argument;
  pthread_mutex_lock(&lock);
  for (;;) {
    while (s->head == NULL && !s->stop) pthread_cond_wait(&changed, &lock);
    if (s->head == NULL) break;
    Work* w = s->head;
    s->running = 1;
    int dropped = s->failed != 0;
    pthread_mutex_unlock(&lock);
    if (!dropped) {
      if (w->kind == WORK_FUNCTION) {
        w->function(w->argument);
      } else if (w->kind == WORK_WAIT_VALUE) {
        while (!waitPasses(w)) pause50us();
      } else {
        while (__atomic_load_n(&stallCopies, __ATOMIC_RELAXED)) pause50us();
        memcpy(w->destination, w->source, w->bytes);
      }
    }
    pthread_mutex_lock(&lock);
    s->head = w->next;
    if (s->head == NULL) s->tail = NULL;
    s->running = 0;
    free(w);
    pthread_cond_broadcast(&changed);
  }
  pthread_mutex_unlock(&lock);
  return NULL;
}

/* The legacy default stream (NULL, or CU_STREAM_LEGACY): the context's,
 * so only a thread with a context current may name it. Made at first use. */
#define FAKE_CU_STREAM_LEGACY ((void*)0x1)
static FakeStream* legacyStream;

/* The stream `stream` names on the calling thread, or NULL with *error set. */
static FakeStream* resolve(void* stream, int* error) {
  if (stream != NULL && stream != FAKE_CU_STREAM_LEGACY) return stream;
  if (!fakeHasContext()) {
    *error = FAKE_CUDA_ERROR_INVALID_CONTEXT;
    return NULL;
  }
  pthread_mutex_lock(&lock);
  if (legacyStream == NULL) {
    legacyStream = calloc(1, sizeof(FakeStream));
    if (legacyStream != NULL) {
      legacyStream->nextStream = streams;
      streams = legacyStream;
      pthread_create(&legacyStream->thread, NULL, runStream, legacyStream);
    }
  }
  FakeStream* s = legacyStream;
  pthread_mutex_unlock(&lock);
  if (s == NULL) *error = FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  return s;
}

static int queueWork(void* stream, Work* w) {
  int error = FAKE_CUDA_SUCCESS;
  FakeStream* s = resolve(stream, &error);
  if (s == NULL) {
    free(w);
    return error;
  }
  w->next = NULL;
  pthread_mutex_lock(&lock);
  if (s->tail)
    s->tail->next = w;
  else
    s->head = w;
  s->tail = w;
  pthread_cond_broadcast(&changed);
  pthread_mutex_unlock(&lock);
  return FAKE_CUDA_SUCCESS;
}

static Work* newWork(int kind) {
  Work* w = calloc(1, sizeof(Work));
  if (w) w->kind = kind;
  return w;
}

int cuStreamCreate(void** stream, unsigned flags) {
  if (stream == NULL || !fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  FakeStream* s = calloc(1, sizeof(FakeStream));
  if (s == NULL) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  s->flags = flags;
  pthread_mutex_lock(&lock);
  s->nextStream = streams;
  streams = s;
  pthread_mutex_unlock(&lock);
  pthread_create(&s->thread, NULL, runStream, s);
  *stream = s;
  return FAKE_CUDA_SUCCESS;
}

/* Waits for the stream's work, then ends it (as the driver's destroy, which
 * returns at once but frees the stream only when its work is done). */
int cuStreamDestroy_v2(void* stream) {
  FakeStream* s = stream;
  if (s == NULL || stream == FAKE_CU_STREAM_LEGACY) return FAKE_CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  s->stop = 1;
  pthread_cond_broadcast(&changed);
  pthread_mutex_unlock(&lock);
  pthread_join(s->thread, NULL);
  pthread_mutex_lock(&lock);
  for (FakeStream** at = &streams; *at; at = &(*at)->nextStream)
    if (*at == s) {
      *at = s->nextStream;
      break;
    }
  pthread_mutex_unlock(&lock);
  free(s);
  return FAKE_CUDA_SUCCESS;
}

int cuStreamGetCtx(void* stream, void** context) {
  if (context == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
  int error = FAKE_CUDA_SUCCESS;
  if (resolve(stream, &error) == NULL) return error;
  *context = fakeContext();
  return FAKE_CUDA_SUCCESS;
}

int cuStreamIsCapturing(void* stream, int* status) {
  if (status == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
  int error = FAKE_CUDA_SUCCESS;
  FakeStream* s = resolve(stream, &error);
  if (s == NULL) return error;
  pthread_mutex_lock(&lock);
  *status = s->capture;
  pthread_mutex_unlock(&lock);
  return FAKE_CUDA_SUCCESS;
}

int cuStreamSynchronize(void* stream) {
  if (fakeUnsafeDuringCapture()) return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  int error = FAKE_CUDA_SUCCESS;
  FakeStream* s = resolve(stream, &error);
  if (s == NULL) return error;
  pthread_mutex_lock(&lock);
  while (s->head != NULL) pthread_cond_wait(&changed, &lock);
  int failed = s->failed;
  pthread_mutex_unlock(&lock);
  return failed ? failed : FAKE_CUDA_SUCCESS;
}

int cuStreamQuery(void* stream) {
  if (fakeUnsafeDuringCapture()) return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  int error = FAKE_CUDA_SUCCESS;
  FakeStream* s = resolve(stream, &error);
  if (s == NULL) return error;
  pthread_mutex_lock(&lock);
  int result = s->failed ? s->failed : s->head ? FAKE_CUDA_ERROR_NOT_READY : FAKE_CUDA_SUCCESS;
  pthread_mutex_unlock(&lock);
  return result;
}

int cuLaunchHostFunc(void* stream, void (*function)(void*), void* argument) {
  if (function == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
  Work* w = newWork(WORK_FUNCTION);
  if (w == NULL) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  w->function = function;
  w->argument = argument;
  return queueWork(stream, w);
}

int cuStreamWaitValue32_v2(void* stream, unsigned long long address, uint32_t value,
                           unsigned flags) {
  if (address == 0 ||
      (flags != FAKE_CU_STREAM_WAIT_VALUE_GEQ && flags != FAKE_CU_STREAM_WAIT_VALUE_EQ))
    return FAKE_CUDA_ERROR_INVALID_VALUE;
  Work* w = newWork(WORK_WAIT_VALUE);
  if (w == NULL) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  w->address = (const volatile uint32_t*)(uintptr_t)address;
  w->value = value;
  w->waitFlags = flags;
  return queueWork(stream, w);
}

static int queueCopy(void* stream, void* destination, const void* source, size_t bytes,
                     unsigned long long device) {
  const void* host = (uintptr_t)destination == device ? source : destination;
  if (!fakeIsPinned(host, bytes) && !fakeMemoryLockFree(FAKE_LOCK_COPIES))
    return FAKE_CUDA_ERROR_MEMORY_LOCK_HELD;
  int result = fakeCheckCopy(device, bytes);
  if (result != FAKE_CUDA_SUCCESS) return result;
  Work* w = newWork(WORK_COPY);
  if (w == NULL) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  w->destination = destination;
  w->source = source;
  w->bytes = bytes;
  return queueWork(stream, w);
}

int cuMemcpyDtoHAsync_v2(void* host, unsigned long long device, size_t bytes, void* stream) {
  return queueCopy(stream, host, (const void*)(uintptr_t)device, bytes, device);
}

int cuMemcpyHtoDAsync_v2(unsigned long long device, const void* host, size_t bytes, void* stream) {
  return queueCopy(stream, (void*)(uintptr_t)device, host, bytes, device);
}

/* The memory of cuMemHostAlloc, which copies reach without the driver's
 * memory lock (fakeMemoryLockFree). */
typedef struct PinnedRange {
  uintptr_t begin, end;
  struct PinnedRange* next;
} PinnedRange;
static PinnedRange* pinned;

int fakeIsPinned(const void* host, size_t bytes) {
  const uintptr_t begin = (uintptr_t)host;
  int found = 0;
  pthread_mutex_lock(&lock);
  for (PinnedRange* r = pinned; r && !found; r = r->next)
    found = begin >= r->begin && begin + bytes <= r->end;
  pthread_mutex_unlock(&lock);
  return found;
}

int cuMemHostAlloc(void** memory, size_t bytes, unsigned flags) {
  if (fakeUnsafeDuringCapture()) return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  (void)flags;
  if (memory == NULL || bytes == 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (!fakeMemoryLockFree(FAKE_LOCK_ALLOCATIONS)) return FAKE_CUDA_ERROR_MEMORY_LOCK_HELD;
  PinnedRange* range = malloc(sizeof(PinnedRange));
  *memory = calloc(1, bytes);
  if (*memory == NULL || range == NULL) {
    free(*memory);
    free(range);
    return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  }
  range->begin = (uintptr_t)*memory;
  range->end = range->begin + bytes;
  pthread_mutex_lock(&lock);
  range->next = pinned;
  pinned = range;
  pthread_mutex_unlock(&lock);
  return FAKE_CUDA_SUCCESS;
}

int cuMemHostGetDevicePointer_v2(unsigned long long* device, void* host, unsigned flags) {
  if (device == NULL || host == NULL || flags != 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  *device = (unsigned long long)(uintptr_t)host;
  return FAKE_CUDA_SUCCESS;
}

static unsigned long freedWhileWaited;

/* Host memory that a queued value wait still reads is counted and left
 * allocated, where the driver would free it under the GPU. */
int cuMemFreeHost(void* memory) {
  if (fakeUnsafeDuringCapture()) return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  int waited = 0;
  pthread_mutex_lock(&lock);
  for (FakeStream* s = streams; s; s = s->nextStream)
    for (Work* w = s->head; w; w = w->next)
      if (w->kind == WORK_WAIT_VALUE && (const void*)w->address == memory) waited = 1;
  if (waited) ++freedWhileWaited;
  for (PinnedRange** at = &pinned; *at && !waited; at = &(*at)->next)
    if ((*at)->begin == (uintptr_t)memory) {
      PinnedRange* gone = *at;
      *at = gone->next;
      free(gone);
      break;
    }
  pthread_mutex_unlock(&lock);
  if (!waited) free(memory);
  return FAKE_CUDA_SUCCESS;
}

/* How many times host memory was freed while a value wait still read it. */
unsigned long fakeCudaHostFreedWhileWaited(void) {
  pthread_mutex_lock(&lock);
  const unsigned long n = freedWhileWaited;
  pthread_mutex_unlock(&lock);
  return n;
}

/* A stream is held when it has a value wait queued or running whose value
 * has not been written: everything behind it waits for the host. */
int fakeStreamsWaitingOnValue(int blockingOnly) {
  int found = 0;
  pthread_mutex_lock(&lock);
  for (FakeStream* s = streams; s; s = s->nextStream) {
    if (blockingOnly && (s->flags & FAKE_CU_STREAM_NON_BLOCKING)) continue;
    for (Work* w = s->head; w; w = w->next)
      if (w->kind == WORK_WAIT_VALUE && !waitPasses(w)) found = 1;
  }
  pthread_mutex_unlock(&lock);
  return found;
}

/* While on, the application's own thread is taken to sit in a call that
 * holds the driver's memory lock while it waits for a held stream, as a
 * copy to pageable memory queued after a braid call does (tensor.cpu()).
 * The calls that take that lock (allocating or mapping memory, copies to
 * or from pageable memory) then wait until no stream is held, and give up
 * after a second with FAKE_CUDA_ERROR_MEMORY_LOCK_HELD, where a GPU would
 * hang if braid made them while a stream waited for the call. `calls` says
 * which calls take the lock (FAKE_LOCK_*, or'ed); 0 turns it off. */
static int memoryLockHeld;
static unsigned long memoryLockRefusals;

void fakeCudaHoldMemoryLockWhileStreamsWait(int calls) {
  __atomic_store_n(&memoryLockHeld, calls, __ATOMIC_RELAXED);
}

unsigned long fakeCudaMemoryLockRefusals(void) {
  return __atomic_load_n(&memoryLockRefusals, __ATOMIC_RELAXED);
}

int fakeMemoryLockFree(int call) {
  if (!(__atomic_load_n(&memoryLockHeld, __ATOMIC_RELAXED) & call)) return 1;
  for (int ms = 0; ms < 1000; ++ms) {
    if (!fakeStreamsWaitingOnValue(0)) return 1;
    const struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
  }
  __atomic_add_fetch(&memoryLockRefusals, 1, __ATOMIC_RELAXED);
  return 0;
}

void fakeSynchronizeStreams(void) {
  pthread_mutex_lock(&lock);
  for (;;) {
    int busy = 0;
    for (FakeStream* s = streams; s; s = s->nextStream) busy |= s->head != NULL;
    if (!busy) break;
    pthread_cond_wait(&changed, &lock);
  }
  pthread_mutex_unlock(&lock);
}

/* Test hooks. */

/* Queues `kernel(argument)` on `stream`, standing for GPU work. */
int fakeCudaLaunchKernel(void* stream, void (*kernel)(void*), void* argument) {
  return cuLaunchHostFunc(stream, kernel, argument);
}

/* Says that `stream` captures a graph (status 1, ACTIVE), or not (0): the
 * stand-in records nothing, it only answers cuStreamIsCapturing so. */
void fakeCudaSetStreamCapture(void* stream, int status) {
  FakeStream* s = stream;
  pthread_mutex_lock(&lock);
  s->capture = status;
  pthread_mutex_unlock(&lock);
}

/* Puts `stream` in a kernel's sticky error: illegal address. */
void fakeCudaFailStream(void* stream) {
  FakeStream* s = stream;
  pthread_mutex_lock(&lock);
  s->failed = FAKE_CUDA_ERROR_ILLEGAL_ADDRESS;
  pthread_cond_broadcast(&changed);
  pthread_mutex_unlock(&lock);
}
