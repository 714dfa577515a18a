/* A framework's view of braid: this file knows only <braid.h> and is built
 * against the installed library with -lbraid. The parent forks N ranks;
 * rank 0 makes the unique id and hands it to the others through a pipe (a
 * process that called braidGetUniqueId runs the rendezvous on a thread, so
 * it must not fork afterwards: a child could inherit a lock that thread
 * held). Each rank runs every collective and checks the result.
 * Usage: all_collectives N */
#include <braid.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;
#define CHECK(call)                                                               \
  do {                                                                            \
    braidResult_t r_ = (call);                                                    \
    if (r_ != braidSuccess) {                                                     \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #call, braidGetLastError(NULL)); \
      return 1;                                                                   \
    }                                                                             \
  } while (0)
#define EXPECT(cond, ...)                                            \
  do {                                                               \
    if (!(cond) && failures++ < 10) {                                \
      fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                  \
      fputc('\n', stderr);                                           \
    }                                                                \
  } while (0)

static int value(int rank, size_t i) {
  return (int)((rank * 5 + i * 3) % 7);
}

static int runRank(braidUniqueId id, int n, int rank) {
  braidComm_t comm;
  enum { C = 1003 };
  size_t i;
  int r;
  int32_t *send = malloc(sizeof(int32_t) * C * n), *recv = malloc(sizeof(int32_t) * C * n);
  CHECK(braidCommInitRank(&comm, n, id, rank));

  for (i = 0; i < C; ++i) send[i] = value(rank, i);
  CHECK(braidAllReduce(send, recv, C, braidInt32, braidSum, comm, NULL));
  for (i = 0; i < C; ++i) {
    int32_t e = 0;
    for (r = 0; r < n; ++r) e += value(r, i);
    EXPECT(recv[i] == e, "allreduce[%zu] = %d, expected %d", i, recv[i], e);
  }
  CHECK(braidReduce(send, recv, C, braidInt32, braidMax, n - 1, comm, NULL));
  if (rank == n - 1)
    for (i = 0; i < C; ++i) {
      int32_t e = 0;
      for (r = 0; r < n; ++r) e = value(r, i) > e ? value(r, i) : e;
      EXPECT(recv[i] == e, "reduce[%zu] = %d, expected %d", i, recv[i], e);
    }
  CHECK(braidBroadcast(send, recv, C, braidInt32, 0, comm, NULL));
  for (i = 0; i < C; ++i) EXPECT(recv[i] == value(0, i), "broadcast[%zu]", i);
  CHECK(braidAllGather(send, recv, C, braidInt32, comm, NULL));
  for (r = 0; r < n; ++r)
    for (i = 0; i < C; ++i) EXPECT(recv[r * C + i] == value(r, i), "allgather[%d][%zu]", r, i);
  for (i = 0; i < (size_t)C * n; ++i) send[i] = value(rank, i);
  CHECK(braidReduceScatter(send, recv, C, braidInt32, braidSum, comm, NULL));
  for (i = 0; i < C; ++i) {
    int32_t e = 0;
    for (r = 0; r < n; ++r) e += value(r, rank * C + i);
    EXPECT(recv[i] == e, "reducescatter[%zu] = %d, expected %d", i, recv[i], e);
  }
  CHECK(braidAllToAll(send, recv, C, braidInt32, comm, NULL));
  for (r = 0; r < n; ++r)
    for (i = 0; i < C; ++i)
      EXPECT(recv[r * C + i] == value(r, rank * C + i), "alltoall[%d][%zu]", r, i);
  CHECK(braidGather(send, recv, C, braidInt32, 1 % n, comm, NULL));
  if (rank == 1 % n)
    for (r = 0; r < n; ++r)
      for (i = 0; i < C; ++i) EXPECT(recv[r * C + i] == value(r, i), "gather[%d][%zu]", r, i);
  CHECK(braidScatter(send, recv, C, braidInt32, 0, comm, NULL));
  for (i = 0; i < C; ++i) EXPECT(recv[i] == value(0, rank * C + i), "scatter[%zu]", i);
  CHECK(braidBarrier(comm, NULL));
  /* A ring of Send/Recv inside one group. */
  CHECK(braidGroupStart());
  CHECK(braidSend(send, C, braidInt32, (rank + 1) % n, comm, NULL));
  CHECK(braidRecv(recv, C, braidInt32, (rank + n - 1) % n, comm, NULL));
  CHECK(braidGroupEnd());
  for (i = 0; i < C; ++i) EXPECT(recv[i] == value((rank + n - 1) % n, i), "ring recv[%zu]", i);
  CHECK(braidCommDestroy(comm));
  free(send);
  free(recv);
  return failures ? 1 : 0;
}

/* Rank r's unique id: rank 0 makes it and writes one copy per other rank
 * into the pipe (writes of at most PIPE_BUF bytes are atomic). */
static int shareId(int r, int n, int fds[2], braidUniqueId* id) {
  int rank = r, k;
  if (r == 0) {
    CHECK(braidGetUniqueId(id));
    for (k = 1; k < n; ++k)
      if (write(fds[1], id, sizeof *id) != (ssize_t)sizeof *id) return 1;
    return 0;
  }
  return read(fds[0], id, sizeof *id) == (ssize_t)sizeof *id ? 0 : 1;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2, r, bad = 0, fds[2];
  braidUniqueId id;
  if (pipe(fds) != 0) return 1;
  for (r = 0; r < n; ++r)
    if (fork() == 0) _exit(shareId(r, n, fds, &id) ? 1 : runRank(id, n, r));
  for (r = 0; r < n; ++r) {
    int status = 0;
    wait(&status);
    bad += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  printf("%d ranks: %s\n", n, bad ? "FAILED" : "every collective passed");
  return bad ? 1 : 0;
}
