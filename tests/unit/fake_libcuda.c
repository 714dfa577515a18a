/* A stand-in for the CUDA driver, libcuda.so.1, with the entry points braid
 * uses: cuPointerGetAttribute to ask about buffers, and the context and copy
 * calls that stage GPU buffers through host memory. It answers as the driver
 * does, with one address range that a test marks as GPU memory
 * (fakeCudaSetDeviceRange): ordinary host memory standing in for device
 * memory, so copies are memcpy, checked to stay inside the range. Every
 * other address is memory the driver does not know
 * (CUDA_ERROR_INVALID_VALUE), as unregistered host memory is. Tests set the
 * range from the thread that later makes the calls, so plain statics
 * suffice.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The driver API's values (cuda.h): CUresult, CUpointer_attribute and
 * CUmemorytype. */
enum {
  FAKE_CUDA_SUCCESS = 0,
  FAKE_CUDA_ERROR_INVALID_VALUE = 1,
  FAKE_CUDA_ERROR_INVALID_CONTEXT = 201,
  FAKE_CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  FAKE_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  FAKE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  FAKE_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  FAKE_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  FAKE_CU_MEMORYTYPE_DEVICE = 2
};

static uintptr_t rangeBegin, rangeEnd;
static int rangeDevice, rangeManaged;
static unsigned long queries;
static unsigned long copies, waits;
static int contextDepth, failCopies;
/* The one context, owner of the range. */
static int theContext;

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
  return copies;
}
unsigned long fakeCudaWaitCount(void) {
  return waits;
}

/* Contexts pushed and not popped: 0 between calls. */
int fakeCudaContextDepth(void) {
  return contextDepth;
}

/* Nonzero: every copy fails with CUDA_ERROR_ILLEGAL_ADDRESS. */
void fakeCudaFailCopies(int fail) {
  failCopies = fail;
}

/* How many times cuPointerGetAttribute was called. */
unsigned long fakeCudaQueryCount(void) {
  return queries;
}

int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
  ++queries;
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

int cuCtxSynchronize(void) {
  if (contextDepth == 0) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  ++waits;
  return FAKE_CUDA_SUCCESS;
}

/* A copy must lie inside the range and run in its context. */
static int checkCopy(unsigned long long device, size_t bytes) {
  if (contextDepth == 0) return FAKE_CUDA_ERROR_INVALID_CONTEXT;
  if (device < rangeBegin || device + bytes > rangeEnd) return FAKE_CUDA_ERROR_INVALID_VALUE;
  if (failCopies) return FAKE_CUDA_ERROR_ILLEGAL_ADDRESS;
  ++copies;
  return FAKE_CUDA_SUCCESS;
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

int cuGetErrorString(int error, const char** text) {
  switch (error) {
    case FAKE_CUDA_SUCCESS:
      *text = "no error";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_INVALID_VALUE:
      *text = "invalid argument";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_INVALID_CONTEXT:
      *text = "invalid device context";
      return FAKE_CUDA_SUCCESS;
    case FAKE_CUDA_ERROR_ILLEGAL_ADDRESS:
      *text = "an illegal memory access was encountered";
      return FAKE_CUDA_SUCCESS;
    default:
      *text = NULL;
      return FAKE_CUDA_ERROR_INVALID_VALUE;
  }
}
