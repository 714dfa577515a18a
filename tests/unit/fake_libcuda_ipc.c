/* Interprocess memory and events of the stand-in CUDA driver, and the
 * stream work that goes with them (copies, event records
 * and waits), enough to run the CUDA-IPC transport's device in one process,
 * or in forked processes that share an arena (fakeCudaShareArena).
 *
 * A memory handle names an allocation's address and the process that
 * exported it; opening it in that same process gives the same address back
 * (CUDA refuses that, but here every "peer" may share the one process).
 * Another process's handle opens only when it names memory of the shared
 * arena, which is at that same address in every process; any other is
 * refused, since its address means nothing here. An event's handle names
 * the event's state, which every event opened from it shares, as processes
 * share a CUDA event; while an arena is shared the state lives in it, so
 * that another process may open the handle too.
 *
 * Records, waits and copies go on the streams of fake_libcuda_streams.c as
 * host functions, so they run in order with the rest of the stream's work.
 * A record advances its event when the stream reaches it; a wait holds its
 * stream until the event has reached the latest record queued before the
 * wait. A state another process may advance is polled, as no condition
 * variable of this process hears that process; such a wait gives up after
 * a limit (fakeCudaSetWaitLimit) by failing its stream, so that a test
 * whose peer never records fails instead of hanging. Work a failed stream
 * drops never runs, and its small argument is lost, as the driver's is.
 */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_libcuda_internal.h"

/* cuda.h's CUipcMemHandle and CUipcEventHandle: passed by value. */
typedef struct {
  char reserved[64];
} FakeIpcHandle;

/* What a handle of the stand-in holds. */
enum { HANDLE_MEMORY = 0x4d454d31, HANDLE_EVENT = 0x45564e31, EVENT_MAGIC = 0x65766e74 };
typedef struct {
  uint32_t kind;
  int32_t pid;
  uint64_t address; /* the allocation, or the event's state */
} HandleContents;

/* Accessed atomically: in the shared arena, other processes change it
 * without this process's lock. */
typedef struct EventState {
  unsigned long recorded;  /* records queued */
  unsigned long completed; /* the latest record the streams reached */
  int references;          /* events, and queued records and waits */
  int shared;              /* in the shared arena: never freed, and waits poll */
} EventState;

typedef struct FakeEvent {
  uint32_t magic;
  unsigned flags;
  EventState* state;
} FakeEvent;

/* An address opened from a handle, and how many opens it has left. */
typedef struct Mapping {
  unsigned long long address;
  int opens;
  struct Mapping* next;
} Mapping;

/* One lock for the events and mappings; a stream's thread takes it only
 * while no lock of the streams is held. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t reached = PTHREAD_COND_INITIALIZER;
static Mapping* mappings;
static unsigned long ipcOpens, liveMappings, liveEvents;
/* How long a wait on a shared state polls before it fails its stream. */
static unsigned waitLimitMs = 30000;

/* Sets that limit (30 s unless set), for tests of a wait that never ends. */
void fakeCudaSetWaitLimit(unsigned milliseconds) {
  __atomic_store_n(&waitLimitMs, milliseconds, __ATOMIC_RELAXED);
}

/* From now on (refuse != 0) this process's opens of interprocess memory
 * (cuIpcOpenMemHandle, cuMemImportFromShareableHandle) fail with
 * CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, as where the exporter's GPU and this
 * one have no peer access. */
static int refuseIpcOpens;
void fakeCudaRefuseIpcOpens(int refuse) {
  __atomic_store_n(&refuseIpcOpens, refuse, __ATOMIC_RELAXED);
}
int fakeRefusesIpcOpens(void) {
  return __atomic_load_n(&refuseIpcOpens, __ATOMIC_RELAXED);
}

/* How many legacy memory handles this process exported (cuIpcGetMemHandle):
 * one per connection's slots, and one per message read in place. */
static unsigned long ipcExports;
unsigned long fakeCudaIpcExportCount(void) {
  return __atomic_load_n(&ipcExports, __ATOMIC_RELAXED);
}

/* How many times a memory handle was opened; the mappings and events not
 * yet closed or destroyed: 0 once everything is released. */
unsigned long fakeCudaIpcOpenCount(void) {
  pthread_mutex_lock(&lock);
  unsigned long count = ipcOpens;
  pthread_mutex_unlock(&lock);
  return count;
}
unsigned long fakeCudaLiveIpcMappings(void) {
  pthread_mutex_lock(&lock);
  unsigned long count = liveMappings;
  pthread_mutex_unlock(&lock);
  return count;
}
unsigned long fakeCudaLiveEvents(void) {
  pthread_mutex_lock(&lock);
  unsigned long count = liveEvents;
  pthread_mutex_unlock(&lock);
  return count;
}

static void writeHandle(FakeIpcHandle* handle, uint32_t kind, uint64_t address) {
  HandleContents contents = {kind, (int32_t)getpid(), address};
  memset(handle->reserved, 0, sizeof(handle->reserved));
  memcpy(handle->reserved, &contents, sizeof(contents));
}

/* The address a handle names, or 0 where it is not one of `kind` from this
 * process. */
static uint64_t readHandle(const FakeIpcHandle* handle, uint32_t kind) {
  HandleContents contents;
  memcpy(&contents, handle->reserved, sizeof(contents));
  if (contents.kind != kind) return 0;
  if (contents.pid == (int32_t)getpid() || fakeInSharedArena(contents.address, 1))
    return contents.address;
  return 0;
}

/* Whether [device, device + bytes) is GPU memory, as the driver knows it. */
static int isDeviceMemory(unsigned long long device, size_t bytes) {
  unsigned type = 0;
  if (cuPointerGetAttribute(&type, FAKE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, device) != 0) return 0;
  return bytes == 0 || cuPointerGetAttribute(&type, FAKE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                             device + bytes - 1) == 0;
}

int cuIpcGetMemHandle(FakeIpcHandle* handle, unsigned long long device) {
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (handle == NULL || !isDeviceMemory(device, 1)) return FAKE_CUDA_ERROR_INVALID_VALUE;
  writeHandle(handle, HANDLE_MEMORY, device);
  __atomic_add_fetch(&ipcExports, 1, __ATOMIC_RELAXED);
  return FAKE_CUDA_SUCCESS;
}

int cuIpcOpenMemHandle_v2(unsigned long long* device, FakeIpcHandle handle, unsigned flags) {
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (device == NULL || (flags & ~1u) != 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (fakeRefusesIpcOpens()) return FAKE_CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  if (!fakeMemoryLockFree(FAKE_LOCK_MAPPINGS)) return FAKE_CUDA_ERROR_MEMORY_LOCK_HELD;
  uint64_t address = readHandle(&handle, HANDLE_MEMORY);
  if (address == 0) return FAKE_CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  Mapping* m = mappings;
  while (m && m->address != address) m = m->next;
  if (m == NULL) {
    m = calloc(1, sizeof(Mapping));
    if (m == NULL) {
      pthread_mutex_unlock(&lock);
      return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->address = address;
    m->next = mappings;
    mappings = m;
  }
  ++m->opens;
  ++ipcOpens;
  ++liveMappings;
  pthread_mutex_unlock(&lock);
  *device = address;
  return FAKE_CUDA_SUCCESS;
}

int cuIpcCloseMemHandle(unsigned long long device) {
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  Mapping** at = &mappings;
  while (*at && (*at)->address != device) at = &(*at)->next;
  if (*at == NULL) {
    pthread_mutex_unlock(&lock);
    return FAKE_CUDA_ERROR_INVALID_VALUE;
  }
  if (--(*at)->opens == 0) {
    Mapping* gone = *at;
    *at = gone->next;
    free(gone);
  }
  --liveMappings;
  pthread_mutex_unlock(&lock);
  return FAKE_CUDA_SUCCESS;
}

/* Called with the lock held. */
static void dropReference(EventState* state) {
  if (__atomic_sub_fetch(&state->references, 1, __ATOMIC_ACQ_REL) == 0 && !state->shared)
    free(state);
}

static FakeEvent* newEvent(EventState* state, unsigned flags) {
  FakeEvent* event = calloc(1, sizeof(FakeEvent));
  if (event == NULL) return NULL;
  event->magic = EVENT_MAGIC;
  event->flags = flags;
  event->state = state;
  __atomic_add_fetch(&state->references, 1, __ATOMIC_ACQ_REL);
  ++liveEvents;
  return event;
}

static FakeEvent* eventOf(void* event) {
  FakeEvent* e = event;
  return e != NULL && e->magic == EVENT_MAGIC ? e : NULL;
}

int cuEventCreate(void** event, unsigned flags) {
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (event == NULL || (flags & ~0x7u) != 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  /* In the shared arena while there is one, so that any process can open
   * the handle; there it stays until the arena goes. */
  int shared = 0;
  EventState* state = fakeSharedCarve(sizeof(EventState), &shared);
  if (state != NULL) {
    memset(state, 0, sizeof(EventState));
    state->shared = 1;
  } else if (!shared) {
    state = calloc(1, sizeof(EventState));
  }
  if (state == NULL) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&lock);
  FakeEvent* created = newEvent(state, flags);
  if (created == NULL && !state->shared) free(state);
  pthread_mutex_unlock(&lock);
  if (created == NULL) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  *event = created;
  return FAKE_CUDA_SUCCESS;
}

/* The driver lets queued records and waits of the event run after it. */
int cuEventDestroy_v2(void* event) {
  FakeEvent* e = eventOf(event);
  if (e == NULL) return FAKE_CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  e->magic = 0;
  dropReference(e->state);
  --liveEvents;
  pthread_mutex_unlock(&lock);
  free(e);
  return FAKE_CUDA_SUCCESS;
}

/* As CUDA: only an interprocess event that does not time has a handle. */
enum { FAKE_CU_EVENT_DISABLE_TIMING = 0x2, FAKE_CU_EVENT_INTERPROCESS = 0x4 };

int cuIpcGetEventHandle(FakeIpcHandle* handle, void* event) {
  FakeEvent* e = eventOf(event);
  if (e == NULL) return FAKE_CUDA_ERROR_INVALID_HANDLE;
  if (handle == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
  const unsigned needed = FAKE_CU_EVENT_DISABLE_TIMING | FAKE_CU_EVENT_INTERPROCESS;
  if ((e->flags & needed) != needed) return FAKE_CUDA_ERROR_INVALID_VALUE;
  writeHandle(handle, HANDLE_EVENT, (uint64_t)(uintptr_t)e->state);
  return FAKE_CUDA_SUCCESS;
}

/* The state a handle names stays valid while an event of it lives, which
 * is as long as a test may open it. */
int cuIpcOpenEventHandle(void** event, FakeIpcHandle handle) {
  if (!fakeHasContext()) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (event == NULL) return FAKE_CUDA_ERROR_INVALID_VALUE;
  EventState* state = (EventState*)(uintptr_t)readHandle(&handle, HANDLE_EVENT);
  if (state == NULL) return FAKE_CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&lock);
  FakeEvent* opened = newEvent(state, FAKE_CU_EVENT_DISABLE_TIMING | FAKE_CU_EVENT_INTERPROCESS);
  pthread_mutex_unlock(&lock);
  if (opened == NULL) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  *event = opened;
  return FAKE_CUDA_SUCCESS;
}

/* A record or a wait in a stream: the event's state, the record, and the
 * stream (which a wait that gives up fails). */
typedef struct {
  EventState* state;
  unsigned long record;
  void* stream;
} EventWork;

static int reachedRecord(EventState* state, unsigned long record) {
  return __atomic_load_n(&state->completed, __ATOMIC_ACQUIRE) >= record;
}

static void recordReached(void* argument) {
  EventWork* w = argument;
  pthread_mutex_lock(&lock);
  /* Records of one stream come in order, but another process's stream may
   * have reached a later record of a shared state first. */
  unsigned long seen = __atomic_load_n(&w->state->completed, __ATOMIC_RELAXED);
  while (seen < w->record && !__atomic_compare_exchange_n(&w->state->completed, &seen, w->record, 1,
                                                          __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
  }
  dropReference(w->state);
  pthread_cond_broadcast(&reached);
  pthread_mutex_unlock(&lock);
  free(w);
}

static double nowSeconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void waitForRecord(void* argument) {
  EventWork* w = argument;
  if (w->state->shared) {
    const double deadline = nowSeconds() + __atomic_load_n(&waitLimitMs, __ATOMIC_RELAXED) / 1000.0;
    const struct timespec pause = {0, 20000};
    while (!reachedRecord(w->state, w->record)) {
      if (nowSeconds() > deadline) {
        fakeCudaFailStream(w->stream);
        break;
      }
      nanosleep(&pause, NULL);
    }
    pthread_mutex_lock(&lock);
  } else {
    pthread_mutex_lock(&lock);
    while (!reachedRecord(w->state, w->record)) pthread_cond_wait(&reached, &lock);
  }
  dropReference(w->state);
  pthread_mutex_unlock(&lock);
  free(w);
}

/* Queues `function` on `stream`, about the record a new record of `e`
 * makes, or else the latest record queued so far. */
static int queueEventWork(void* stream, FakeEvent* e, void (*function)(void*), int isRecord) {
  /* Refused before a record takes a number, which then always runs (or is
   * dropped with a failed stream): cuLaunchHostFunc fails otherwise only
   * for want of memory. */
  if (stream == NULL) return FAKE_CUDA_ERROR_INVALID_HANDLE;
  EventWork* w = malloc(sizeof(EventWork));
  if (w == NULL) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  /* Held while queueing, so that this process's records are queued in the
   * order of their numbers; the stream's thread takes this lock only
   * outside its own. The number is taken atomically, as records of a
   * shared state may come from several processes. */
  pthread_mutex_lock(&lock);
  w->state = e->state;
  w->stream = stream;
  __atomic_add_fetch(&w->state->references, 1, __ATOMIC_ACQ_REL);
  w->record = isRecord ? __atomic_add_fetch(&w->state->recorded, 1, __ATOMIC_ACQ_REL)
                       : __atomic_load_n(&w->state->recorded, __ATOMIC_ACQUIRE);
  int result = cuLaunchHostFunc(stream, function, w);
  if (result != FAKE_CUDA_SUCCESS) {
    /* A numbered record that will not run counts as reached, so that no
     * wait for it hangs. */
    if (isRecord) {
      pthread_mutex_unlock(&lock);
      recordReached(w);
      return result;
    }
    dropReference(w->state);
  }
  pthread_mutex_unlock(&lock);
  if (result != FAKE_CUDA_SUCCESS) free(w);
  return result;
}

int cuEventRecord(void* event, void* stream) {
  FakeEvent* e = eventOf(event);
  if (e == NULL) return FAKE_CUDA_ERROR_INVALID_HANDLE;
  return queueEventWork(stream, e, recordReached, 1);
}

int cuStreamWaitEvent(void* stream, void* event, unsigned flags) {
  FakeEvent* e = eventOf(event);
  if (e == NULL) return FAKE_CUDA_ERROR_INVALID_HANDLE;
  if (flags != 0) return FAKE_CUDA_ERROR_INVALID_VALUE;
  return queueEventWork(stream, e, waitForRecord, 0);
}

typedef struct {
  void* destination;
  const void* source;
  size_t bytes;
} CopyWork;

static void copyOnStream(void* argument) {
  CopyWork* w = argument;
  memcpy(w->destination, w->source, w->bytes);
  free(w);
}

/* Both ends checked when queued, as the driver validates its arguments.
 * With unified addressing a copy's direction comes from its addresses: one
 * that starts in GPU memory must lie in it wholly; any other is host memory
 * (pinned, from cuMemHostAlloc, where a GPU would need it). */
int cuMemcpyAsync(unsigned long long destination, unsigned long long source, size_t bytes,
                  void* stream) {
  const int toDevice = isDeviceMemory(destination, 1), fromDevice = isDeviceMemory(source, 1);
  int result = FAKE_CUDA_SUCCESS;
  if (toDevice && fromDevice) {
    result = fakeCheckDeviceCopy(destination, bytes);
    if (result == FAKE_CUDA_SUCCESS && !isDeviceMemory(source, bytes))
      result = FAKE_CUDA_ERROR_INVALID_VALUE;
  } else if (toDevice || fromDevice) {
    const unsigned long long host = toDevice ? source : destination;
    if (!fakeIsPinned((const void*)(uintptr_t)host, bytes) && !fakeMemoryLockFree(FAKE_LOCK_COPIES))
      return FAKE_CUDA_ERROR_MEMORY_LOCK_HELD;
    result = fakeCheckCopy(toDevice ? destination : source, bytes);
  }
  if (result != FAKE_CUDA_SUCCESS) return result;
  CopyWork* w = malloc(sizeof(CopyWork));
  if (w == NULL) return FAKE_CUDA_ERROR_OUT_OF_MEMORY;
  w->destination = (void*)(uintptr_t)destination;
  w->source = (const void*)(uintptr_t)source;
  w->bytes = bytes;
  result = cuLaunchHostFunc(stream, copyOnStream, w);
  if (result != FAKE_CUDA_SUCCESS) free(w);
  return result;
}

int cuEventQuery(void* event) {
  if (fakeUnsafeDuringCapture()) return FAKE_CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  FakeEvent* e = eventOf(event);
  if (e == NULL) return FAKE_CUDA_ERROR_INVALID_HANDLE;
  const unsigned long recorded = __atomic_load_n(&e->state->recorded, __ATOMIC_ACQUIRE);
  return reachedRecord(e->state, recorded) ? FAKE_CUDA_SUCCESS : FAKE_CUDA_ERROR_NOT_READY;
}
