/* A rank that joins through braidCommInitFromEnv (whatever launcher started
 * it), checks an AllReduce, a Broadcast and a Barrier, and prints one line.
 * Exit status 0 means every check passed. */
#include <stdio.h>
#include <stdlib.h>

#include "braid.h"

#define CHECK(call)                                                          \
  do {                                                                       \
    braidResult_t r_ = (call);                                               \
    if (r_ != braidSuccess) {                                                \
      fprintf(stderr, "%s failed: %s: %s\n", #call, braidGetErrorString(r_), \
              braidGetLastError(NULL));                                      \
      return 1;                                                              \
    }                                                                        \
  } while (0)

int main(void) {
  braidComm_t comm;
  int rank, size, i;
  double values[1000];
  CHECK(braidCommInitFromEnv(&comm));
  CHECK(braidCommUserRank(comm, &rank));
  CHECK(braidCommCount(comm, &size));
  for (i = 0; i < 1000; ++i) values[i] = rank + i;
  CHECK(braidAllReduce(values, values, 1000, braidFloat64, braidSum, comm, NULL));
  for (i = 0; i < 1000; ++i) {
    double expected = (double)size * (size - 1) / 2 + (double)size * i;
    if (values[i] != expected) {
      fprintf(stderr, "rank %d: allreduce[%d] = %g, expected %g\n", rank, i, values[i], expected);
      return 1;
    }
  }
  int token = rank == size - 1 ? 4242 : 0;
  CHECK(braidBroadcast(&token, &token, 1, braidInt32, size - 1, comm, NULL));
  if (token != 4242) {
    fprintf(stderr, "rank %d: broadcast gave %d\n", rank, token);
    return 1;
  }
  CHECK(braidBarrier(comm, NULL));
  printf("rank %d of %d ok\n", rank, size);
  CHECK(braidCommDestroy(comm));
  return 0;
}
