/* Failures as a user of braid.h alone sees them, on real processes (this
 * program forks its ranks and joins them through braidCommInitFromEnv):
 *
 *   abi_failures kill      4 ranks; rank 3 is killed with SIGKILL in the middle
 *                          of a 64 MiB AllReduce. Every survivor's call must
 *                          return an error within 2 s, naming rank 3, and so
 *                          must its next call.
 *   abi_failures mismatch  2 ranks call AllReduce with different counts; both
 *                          must get braidInvalidUsage.
 *
 * Exit status 0 when every check passed. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "braid.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int freePort(void) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, (struct sockaddr*)&a, sizeof a) != 0 ||
      getsockname(fd, (struct sockaddr*)&a, &len) != 0)
    return -1;
  close(fd);
  return ntohs(a.sin_port);
}

/* Whether `why` names rank `r`: "rank 3", or 3 in a list such as
 * "connections lost: ranks 2, 3" (a survivor that gave up first may be
 * named before the dead rank). */
static int namesRank(const char* why, int r) {
  char alone[32];
  snprintf(alone, sizeof alone, "rank %d", r);
  if (strstr(why, alone)) return 1;
  for (const char* p = strstr(why, "ranks "); p; p = strstr(p + 1, "ranks ")) {
    const char* q = p + strlen("ranks ");
    while (*q >= '0' && *q <= '9') {
      char* end = NULL;
      long v = strtol(q, &end, 10);
      if (v == r) return 1;
      q = end;
      if (q[0] == ',' && q[1] == ' ') q += 2;
    }
  }
  return 0;
}

static void* killMeSoon(void* unused) {
  (void)unused;
  usleep(30000); /* the AllReduce is under way by now */
  kill(getpid(), SIGKILL);
  return NULL;
}

static int killRank(int rank, braidComm_t comm) {
  const size_t count = (size_t)16 << 20; /* 64 MiB of float32 */
  float* x = malloc(count * sizeof(float));
  size_t i;
  for (i = 0; i < count; ++i) x[i] = 1.0f;
  if (braidAllReduce(x, x, 1024, braidFloat32, braidSum, comm, NULL) != braidSuccess) {
    fprintf(stderr, "rank %d: warm-up AllReduce failed: %s\n", rank, braidGetLastError(NULL));
    return 1;
  }
  if (rank == 3) {
    pthread_t killer;
    pthread_create(&killer, NULL, killMeSoon, NULL);
    for (;;) braidAllReduce(x, x, count, braidFloat32, braidSum, comm, NULL);
  }
  double start = now();
  braidResult_t r = braidAllReduce(x, x, count, braidFloat32, braidSum, comm, NULL);
  double seconds = now() - start;
  char why[1024]; /* the next call replaces the last error's text */
  snprintf(why, sizeof why, "%s", braidGetLastError(NULL));
  int failures = 0;
  if (r == braidSuccess) {
    fprintf(stderr, "rank %d: AllReduce succeeded although rank 3 died\n", rank);
    ++failures;
  } else if (seconds > 2.0) {
    fprintf(stderr, "rank %d: the error took %.2f s: %s\n", rank, seconds, why);
    ++failures;
  } else if (!namesRank(why, 3)) {
    fprintf(stderr, "rank %d: the error does not name rank 3: %s\n", rank, why);
    ++failures;
  }
  start = now();
  r = braidAllReduce(x, x, 1024, braidFloat32, braidSum, comm, NULL);
  if (r == braidSuccess || now() - start > 2.0) {
    fprintf(stderr, "rank %d: the next call returned %s after %.2f s\n", rank,
            braidGetErrorString(r), now() - start);
    ++failures;
  }
  if (!failures) printf("rank %d: error after %.3f s: %s\n", rank, seconds, why);
  braidCommDestroy(comm);
  free(x);
  return failures ? 1 : 0;
}

static int mismatchRank(int rank, braidComm_t comm) {
  float x[200] = {0};
  braidResult_t r = braidAllReduce(x, x, rank == 0 ? 100 : 200, braidFloat32, braidSum, comm, NULL);
  const char* why = braidGetLastError(NULL);
  /* A rank that got nothing stray hears of it in its next call at the latest. */
  if (r == braidSuccess) {
    r = braidBarrier(comm, NULL);
    why = braidGetLastError(NULL);
  }
  if (r != braidInvalidUsage) {
    fprintf(stderr, "rank %d: got %s, not braidInvalidUsage: %s\n", rank, braidGetErrorString(r),
            why);
    return 1;
  }
  printf("rank %d: %s\n", rank, why);
  usleep(300000); /* let the peer see the mismatch before this rank leaves */
  braidCommDestroy(comm);
  return 0;
}

int main(int argc, char** argv) {
  const int killMode = argc > 1 && strcmp(argv[1], "kill") == 0;
  if (argc < 2 || (!killMode && strcmp(argv[1], "mismatch") != 0)) {
    fprintf(stderr, "usage: %s kill|mismatch\n", argv[0]);
    return 2;
  }
  const int nranks = killMode ? 4 : 2;
  char text[64];
  int port = freePort(), rank, failed = 0;
  if (port < 0) return 2;
  snprintf(text, sizeof text, "127.0.0.1:%d", port);
  setenv("BRAID_ADDR", text, 1);
  snprintf(text, sizeof text, "%d", nranks);
  setenv("BRAID_WORLD_SIZE", text, 1);
  setenv("BRAID_SECRET", "5eed5eed5eed5eed5eed5eed5eed5eed", 1);
  pid_t pids[4];
  for (rank = 0; rank < nranks; ++rank) {
    pids[rank] = fork();
    if (pids[rank] == 0) {
      braidComm_t comm;
      snprintf(text, sizeof text, "%d", rank);
      setenv("BRAID_RANK", text, 1);
      if (braidCommInitFromEnv(&comm) != braidSuccess) {
        fprintf(stderr, "rank %d: init failed: %s\n", rank, braidGetLastError(NULL));
        _exit(1);
      }
      const int failures = killMode ? killRank(rank, comm) : mismatchRank(rank, comm);
      fflush(stdout);
      _exit(failures);
    }
  }
  for (rank = 0; rank < nranks; ++rank) {
    int status = 0;
    waitpid(pids[rank], &status, 0);
    const int victim = killMode && rank == 3;
    if (victim ? !(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
               : !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      fprintf(stderr, "rank %d ended badly (status %#x)\n", rank, status);
      failed = 1;
    }
  }
  return failed;
}
