/*
 * braid.h compiles as strict C99 (-std=c99 -Wall -Wextra -Wpedantic -Werror),
 * every function it declares links with the prototype below, and the calls
 * that need no peer behave as documented. Exits non-zero on any failure.
 */
#include <stdio.h>
#include <string.h>

#include "braid.h"

/* Compile-time checks, C99 style: a negative array size fails the build. */
typedef char check_unique_id_size[sizeof(braidUniqueId) == BRAID_UNIQUE_ID_BYTES ? 1 : -1];
typedef char check_version_code
    [BRAID_VERSION_CODE == BRAID_MAJOR * 10000 + BRAID_MINOR * 100 + BRAID_PATCH ? 1 : -1];
typedef char check_result_codes[braidSuccess == 0 && braidNotSupported == 9 ? 1 : -1];
typedef char check_type_codes[braidInt8 == 0 && braidFloat64 == 9 && braidNumTypes == 10 ? 1 : -1];
typedef char check_op_codes[braidSum == 0 && braidAvg == 4 && braidNumOps == 5 ? 1 : -1];

/* Every function, with the exact prototype of the contract: a changed
 * signature fails to compile, a missing symbol fails to link (the pointers
 * have external linkage, so the optimizer cannot drop the references). */
const char* (*const p_error_string)(braidResult_t) = braidGetErrorString;
const char* (*const p_last_error)(braidComm_t) = braidGetLastError;
braidResult_t (*const p_version)(int*) = braidGetVersion;
braidResult_t (*const p_unique_id)(braidUniqueId*) = braidGetUniqueId;
braidResult_t (*const p_init_rank)(braidComm_t*, int, braidUniqueId, int) = braidCommInitRank;
braidResult_t (*const p_init_env)(braidComm_t*) = braidCommInitFromEnv;
braidResult_t (*const p_split)(braidComm_t, int, int, braidComm_t*) = braidCommSplit;
braidResult_t (*const p_destroy)(braidComm_t) = braidCommDestroy;
braidResult_t (*const p_abort)(braidComm_t) = braidCommAbort;
braidResult_t (*const p_async)(braidComm_t, braidResult_t*) = braidCommGetAsyncError;
braidResult_t (*const p_count)(braidComm_t, int*) = braidCommCount;
braidResult_t (*const p_user_rank)(braidComm_t, int*) = braidCommUserRank;
braidResult_t (*const p_allreduce)(const void*, void*, size_t, braidDataType_t, braidRedOp_t,
                                   braidComm_t, braidStream_t) = braidAllReduce;
braidResult_t (*const p_broadcast)(const void*, void*, size_t, braidDataType_t, int, braidComm_t,
                                   braidStream_t) = braidBroadcast;
braidResult_t (*const p_reduce)(const void*, void*, size_t, braidDataType_t, braidRedOp_t, int,
                                braidComm_t, braidStream_t) = braidReduce;
braidResult_t (*const p_allgather)(const void*, void*, size_t, braidDataType_t, braidComm_t,
                                   braidStream_t) = braidAllGather;
braidResult_t (*const p_reduce_scatter)(const void*, void*, size_t, braidDataType_t, braidRedOp_t,
                                        braidComm_t, braidStream_t) = braidReduceScatter;
braidResult_t (*const p_alltoall)(const void*, void*, size_t, braidDataType_t, braidComm_t,
                                  braidStream_t) = braidAllToAll;
braidResult_t (*const p_gather)(const void*, void*, size_t, braidDataType_t, int, braidComm_t,
                                braidStream_t) = braidGather;
braidResult_t (*const p_scatter)(const void*, void*, size_t, braidDataType_t, int, braidComm_t,
                                 braidStream_t) = braidScatter;
braidResult_t (*const p_barrier)(braidComm_t, braidStream_t) = braidBarrier;
braidResult_t (*const p_send)(const void*, size_t, braidDataType_t, int, braidComm_t,
                              braidStream_t) = braidSend;
braidResult_t (*const p_recv)(void*, size_t, braidDataType_t, int, braidComm_t,
                              braidStream_t) = braidRecv;
braidResult_t (*const p_group_start)(void) = braidGroupStart;
braidResult_t (*const p_group_end)(void) = braidGroupEnd;
braidResult_t (*const p_stream_create)(braidComm_t, braidStream_t*) = braidStreamCreate;
braidResult_t (*const p_stream_cuda)(braidComm_t, void*,
                                     braidStream_t*) = braidStreamCreateFromCuda;
braidResult_t (*const p_stream_sync)(braidStream_t) = braidStreamSynchronize;
braidResult_t (*const p_stream_query)(braidStream_t) = braidStreamQuery;
braidResult_t (*const p_stream_destroy)(braidStream_t) = braidStreamDestroy;
braidResult_t (*const p_init_store)(braidComm_t*, int, const braidStore_t*,
                                    int) = braidCommInitRankWithStore;
braidResult_t (*const p_stream_callback)(braidStream_t, braidStreamCallback_t,
                                         void*) = braidStreamAddCallback;

/* void (*)(void) converts to and from every function pointer type. */
typedef void (*any_function)(void);

static int failures = 0;

static void check(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s (last error: \"%s\")\n", what, braidGetLastError(NULL));
    ++failures;
  }
}

int main(void) {
  const any_function all[] = {
      (any_function)p_error_string,   (any_function)p_last_error,
      (any_function)p_version,        (any_function)p_unique_id,
      (any_function)p_init_rank,      (any_function)p_init_env,
      (any_function)p_split,          (any_function)p_destroy,
      (any_function)p_abort,          (any_function)p_async,
      (any_function)p_count,          (any_function)p_user_rank,
      (any_function)p_allreduce,      (any_function)p_broadcast,
      (any_function)p_reduce,         (any_function)p_allgather,
      (any_function)p_reduce_scatter, (any_function)p_alltoall,
      (any_function)p_gather,         (any_function)p_scatter,
      (any_function)p_barrier,        (any_function)p_send,
      (any_function)p_recv,           (any_function)p_group_start,
      (any_function)p_group_end,      (any_function)p_stream_create,
      (any_function)p_stream_cuda,    (any_function)p_stream_sync,
      (any_function)p_stream_query,   (any_function)p_stream_destroy,
      (any_function)p_init_store,     (any_function)p_stream_callback,
  };
  const char* names[braidNotSupported + 1];
  int version = -1;
  int i, j;
  const char* last;
  braidComm_t comm = NULL;
  braidUniqueId id;
  float x[3] = {1.0f, 2.0f, 3.0f};
  float y[3] = {0.0f, 0.0f, 0.0f};

  for (i = 0; i < (int)(sizeof all / sizeof all[0]); ++i) check(all[i] != NULL, "function address");
  check(sizeof all / sizeof all[0] == 32, "32 functions");

  last = braidGetLastError(NULL);
  check(last != NULL && last[0] == '\0', "braidGetLastError(NULL) is \"\" before any failure");

  check(braidGetVersion(&version) == braidSuccess, "braidGetVersion");
  check(version == BRAID_VERSION_CODE, "version == BRAID_VERSION_CODE");
  check(braidGetVersion(NULL) == braidInvalidArgument, "braidGetVersion(NULL)");

  for (i = braidSuccess; i <= braidNotSupported; ++i) {
    names[i] = braidGetErrorString((braidResult_t)i);
    check(names[i] != NULL && names[i][0] != '\0', "braidGetErrorString names every code");
    for (j = 0; j < i && names[i] != NULL; ++j)
      check(names[j] == NULL || strcmp(names[i], names[j]) != 0, "error names are distinct");
  }

  check(braidGroupEnd() == braidInvalidUsage, "braidGroupEnd without braidGroupStart");
  last = braidGetLastError(NULL);
  check(last != NULL && strstr(last, "braidGroupEnd") != NULL, "last error names braidGroupEnd");
  check(braidCommDestroy(NULL) == braidSuccess, "braidCommDestroy(NULL)");
  check(braidStreamDestroy(NULL) == braidSuccess, "braidStreamDestroy(NULL)");
  check(braidStreamQuery(NULL) == braidInvalidArgument, "braidStreamQuery(NULL)");
  {
    braidStore_t store = {NULL, NULL, NULL, NULL};
    check(braidCommInitRankWithStore(&comm, 1, &store, 0) == braidInvalidArgument,
          "braidCommInitRankWithStore without callbacks");
    check(braidStreamAddCallback(NULL, NULL, NULL) == braidInvalidArgument,
          "braidStreamAddCallback(NULL)");
  }

  /* A 1-rank communicator needs no peer. */
  check(braidGetUniqueId(&id) == braidSuccess, "braidGetUniqueId");
  check(braidCommInitRank(&comm, 1, id, 0) == braidSuccess, "braidCommInitRank(1 rank)");
  if (comm != NULL) {
    check(braidAllReduce(x, y, 3, braidFloat32, braidSum, comm, NULL) == braidSuccess,
          "braidAllReduce on 1 rank");
    check(y[0] == 1.0f && y[1] == 2.0f && y[2] == 3.0f, "1-rank AllReduce copies");
    check(braidCommDestroy(comm) == braidSuccess, "braidCommDestroy");
  }

  if (failures == 0) printf("c99 header test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
