/* A stand-in for the CUDA driver, libcuda.so.1, with the one entry point
 * braid asks about buffers: cuPointerGetAttribute. It answers as the driver
 * does for the attributes braid reads, with one address range that a test
 * marks as GPU memory (fakeCudaSetDeviceRange); every other address is
 * memory the driver does not know (CUDA_ERROR_INVALID_VALUE), as
 * unregistered host memory is. Tests set the range from the thread that
 * later makes the calls, so plain statics suffice.
 */
#include <stddef.h>
#include <stdint.h>

/* The driver API's values (cuda.h): CUresult, CUpointer_attribute and
 * CUmemorytype. */
enum {
  FAKE_CUDA_SUCCESS = 0,
  FAKE_CUDA_ERROR_INVALID_VALUE = 1,
  FAKE_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  FAKE_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  FAKE_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  FAKE_CU_MEMORYTYPE_DEVICE = 2
};

static uintptr_t rangeBegin, rangeEnd;
static int rangeDevice, rangeManaged;
static unsigned long queries;

/* Marks [begin, begin + bytes) as memory of GPU `device`, managed or not;
 * bytes = 0 clears it. */
void fakeCudaSetDeviceRange(void* begin, size_t bytes, int device, int managed) {
  rangeBegin = (uintptr_t)begin;
  rangeEnd = rangeBegin + bytes;
  rangeDevice = device;
  rangeManaged = managed;
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
