/* One rank of the two-hosts test: joins through braidCommInitFromEnv, checks
 * that the transport to every peer is shm on its own host and tcp to the
 * other (HOSTS lists each rank's host, e.g. "a,a,b,b"), then runs
 * collectives across both and checks every element. Exit 0 = all passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "braid.h"

#define CHECK(call)                                                                         \
  do {                                                                                      \
    braidResult_t r_ = (call);                                                              \
    if (r_ != braidSuccess) {                                                               \
      fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #call, braidGetErrorString(r_), \
              braidGetLastError(NULL));                                                     \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

/* The host letter of `r` in "a,a,b,b". */
static char hostOf(const char* hosts, int r) {
  return hosts[2 * r];
}

int main(void) {
  int rank = -1, size = 0, peer, failures = 0;
  braidComm_t comm;
  const char* hosts = getenv("HOSTS");
  if (!hosts) {
    fprintf(stderr, "HOSTS is not set\n");
    return 2;
  }
  CHECK(braidCommInitFromEnv(&comm));
  CHECK(braidCommUserRank(comm, &rank));
  CHECK(braidCommCount(comm, &size));
  if ((int)strlen(hosts) != 2 * size - 1) {
    fprintf(stderr, "HOSTS names %d ranks, the communicator has %d\n", (int)(strlen(hosts) + 1) / 2,
            size);
    return 2;
  }
  for (peer = 0; peer < size; ++peer) {
    const char* got = NULL;
    const char* want = peer == rank                                 ? "self"
                       : hostOf(hosts, peer) == hostOf(hosts, rank) ? "shm"
                                                                    : "tcp";
    CHECK(braidCommGetTransport(comm, peer, &got));
    if (strcmp(got, want) != 0) {
      fprintf(stderr, "rank %d: transport to rank %d is %s, expected %s\n", rank, peer, got, want);
      ++failures;
    }
  }

  size_t counts[] = {1, 1000, 1 << 20};
  for (int c = 0; c < 3; ++c) {
    size_t n = counts[c], i;
    float* x = malloc(n * sizeof(float));
    float* all = malloc(n * size * sizeof(float));
    for (i = 0; i < n; ++i) x[i] = (float)(rank + 1) * (float)(i % 7);
    CHECK(braidAllReduce(x, x, n, braidFloat32, braidSum, comm, NULL));
    for (i = 0; i < n; ++i) {
      float want = (float)(size * (size + 1) / 2) * (float)(i % 7);
      if (x[i] != want && failures++ < 5)
        fprintf(stderr, "rank %d: allreduce[%zu] = %g, expected %g\n", rank, i, x[i], want);
    }
    for (i = 0; i < n; ++i) x[i] = (float)(rank * 1000 + (int)(i % 1000));
    CHECK(braidAllGather(x, all, n, braidFloat32, comm, NULL));
    for (i = 0; i < n * size; ++i) {
      float want = (float)((int)(i / n) * 1000 + (int)(i % n % 1000));
      if (all[i] != want && failures++ < 5)
        fprintf(stderr, "rank %d: allgather[%zu] = %g, expected %g\n", rank, i, all[i], want);
    }
    for (i = 0; i < n; ++i) x[i] = rank == size - 1 ? (float)(i % 977) : -1.0f;
    CHECK(braidBroadcast(x, x, n, braidFloat32, size - 1, comm, NULL));
    for (i = 0; i < n; ++i)
      if (x[i] != (float)(i % 977) && failures++ < 5)
        fprintf(stderr, "rank %d: broadcast[%zu] = %g\n", rank, i, x[i]);
    free(x);
    free(all);
  }
  CHECK(braidBarrier(comm, NULL));
  CHECK(braidCommDestroy(comm));
  if (failures == 0) printf("rank %d (host %c) ok\n", rank, hostOf(hosts, rank));
  return failures ? 1 : 0;
}
