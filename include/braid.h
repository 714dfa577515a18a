/*
 * braid: collective communication for distributed training.
 *
 * This header is the whole public interface of libbraid. It is plain C99,
 * needs no CUDA headers, and follows NCCL's names and argument order so that
 * code written for NCCL ports by renaming `nccl` to `braid`.
 *
 * Conventions that hold for every function below:
 *  - Every function returns braidResult_t. On failure, braidGetLastError()
 *    returns a message that names the call and the offending argument.
 *  - Counts are in elements of `datatype`, never bytes.
 *  - `stream == NULL` runs the call on the calling thread and returns when it
 *    is complete. A stream from braidStreamCreate() queues the call and
 *    returns at once; its result is reported by braidStreamSynchronize() or
 *    braidStreamQuery().
 *  - `count == 0` is a valid no-op; then any buffer may be NULL.
 *  - A call that is not in place never modifies its send buffer.
 *  - A call that makes no progress for BRAID_TIMEOUT seconds (default 300)
 *    returns braidTimeout; a call that needs a peer that died or aborted
 *    returns braidRemoteError naming that peer. Ranks whose calls do not match
 *    (collective, count, datatype, op or root) return braidInvalidUsage.
 *  - Nothing is thrown across this interface and no call aborts the process.
 *  - braid state does not cross fork(): a child must not use communicators or
 *    streams created by its parent, but may create its own.
 */
#ifndef BRAID_H_
#define BRAID_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BRAID_MAJOR 0
#define BRAID_MINOR 1
#define BRAID_PATCH 0
#define BRAID_VERSION_CODE (BRAID_MAJOR * 10000 + BRAID_MINOR * 100 + BRAID_PATCH)

/* Opaque handle of a communicator: a group of ranks that run collectives together. */
typedef struct braidComm* braidComm_t;
/* Opaque handle of an ordered queue of calls run asynchronously by braid. */
typedef struct braidStream* braidStream_t;

#define BRAID_UNIQUE_ID_BYTES 128
/* Rendezvous token from braidGetUniqueId(): rank 0's address and a random
 * 128-bit secret. Hand the same bytes to every rank out of band; treat them
 * as a credential (whoever holds them may join the communicator). */
typedef struct {
  char internal[BRAID_UNIQUE_ID_BYTES];
} braidUniqueId;

typedef enum {
  braidSuccess = 0,
  braidSystemError = 1,     /* the OS or network failed (errno-level) */
  braidInternalError = 2,   /* a bug in braid */
  braidInvalidArgument = 3, /* bad pointer, count, datatype, op, root, peer, nranks */
  braidInvalidUsage = 4,    /* misuse: ranks calling different collectives, counts or roots;
                               unbalanced group calls; a call on an aborted communicator */
  braidRemoteError = 5,     /* a peer failed, disconnected or aborted */
  braidInProgress = 6,      /* an asynchronous operation has not finished */
  braidTimeout = 7,         /* no progress within the communicator's timeout */
  braidUnhandledCudaError = 8,
  braidNotSupported = 9 /* e.g. GPU buffers where this build cannot serve them */
} braidResult_t;

typedef enum {
  braidInt8,
  braidUint8,
  braidInt32,
  braidUint32,
  braidInt64,
  braidUint64,
  braidFloat16,  /* IEEE 754 binary16; reductions accumulate each pair in fp32 */
  braidBfloat16, /* bfloat16; reductions accumulate each pair in fp32 */
  braidFloat32,
  braidFloat64,
  braidNumTypes
} braidDataType_t;

/* Integer Sum and Prod wrap in the type's width. Avg is the sum divided by
 * nranks, truncated toward zero for integers. Max and Min of floating types
 * give NaN wherever any rank's element is NaN, whatever the algorithm. */
typedef enum { braidSum, braidProd, braidMax, braidMin, braidAvg, braidNumOps } braidRedOp_t;

/* ---------------------------------------------------------------------------
 * Library
 * ------------------------------------------------------------------------- */

/* A static, human-readable name for `result`; never NULL. */
const char* braidGetErrorString(braidResult_t result);

/* The message of the calling thread's last failed braid call, "" if none.
 * Never NULL. `comm` may be NULL; the message is per thread either way. */
const char* braidGetLastError(braidComm_t comm);

/* Writes BRAID_MAJOR*10000 + BRAID_MINOR*100 + BRAID_PATCH to *version.
 * Errors: braidInvalidArgument if version is NULL. */
braidResult_t braidGetVersion(int* version);

/* Creates the rendezvous token on the process that will be rank 0. It opens a
 * listening socket on the bootstrap interface (BRAID_SOCKET_IFNAME, else the
 * first non-loopback interface that accepts a connection to itself, else
 * loopback) and serves the rendezvous from a braid thread until every rank of
 * the communicator has joined (or BRAID_TIMEOUT passes).
 * Errors: braidInvalidArgument (NULL), braidSystemError (no usable interface). */
braidResult_t braidGetUniqueId(braidUniqueId* uniqueId);

/* ---------------------------------------------------------------------------
 * Communicators
 * ------------------------------------------------------------------------- */

/* Collective over `nranks` processes that share `uniqueId`; each passes its
 * own `rank` in [0, nranks). Blocks until every rank has joined and every
 * pair of ranks is connected and authenticated with the id's secret.
 * Errors: braidInvalidArgument (NULL comm, nranks < 1, rank out of range,
 * malformed id), braidTimeout (rank 0 unreachable within BRAID_TIMEOUT),
 * braidInvalidUsage (ranks disagree on nranks, or a rank joined twice),
 * braidRemoteError (a peer failed the handshake), braidSystemError. */
braidResult_t braidCommInitRank(braidComm_t* comm, int nranks, braidUniqueId uniqueId, int rank);

/* Like braidCommInitRank, with rank, size and rank 0's address from the
 * environment; the first complete set wins:
 *   BRAID_RANK, BRAID_WORLD_SIZE, BRAID_ADDR (host:port of rank 0);
 *   RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun);
 *   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE (Open MPI) with BRAID_ADDR or
 *   MASTER_ADDR/MASTER_PORT; SLURM_PROCID, SLURM_NTASKS (Slurm) likewise.
 * Rank 0 listens on that address. BRAID_SECRET (32 hex digits), when set on
 * every rank, authenticates the ranks to each other.
 * Errors: as braidCommInitRank, and braidInvalidArgument when the variables
 * are missing or malformed (the message names the variable). */
braidResult_t braidCommInitFromEnv(braidComm_t* comm);

/* braid extension: a key-value store that the ranks already share (a
 * framework's rendezvous store, a launcher's key-value service, a file on a
 * shared file system), through which braidCommInitRankWithStore hands rank
 * 0's unique id to the other ranks. braid calls `set` and `get` only on the
 * thread that called braidCommInitRankWithStore, and never after it
 * returned. Keys are NUL-terminated strings; values are bytes. */
typedef struct {
  void* context; /* handed back to set and get unchanged */
  /* Prepended to every key braid uses (NULL = ""). Communicators created on
   * one store need distinct prefixes, or a rank may read another
   * communicator's id. */
  const char* keyPrefix;
  /* Makes the `bytes` bytes at `value` the value of `key` for every rank.
   * Returns braidSuccess or an error code (braidSystemError when the store
   * failed), which braidCommInitRankWithStore returns. */
  braidResult_t (*set)(void* context, const char* key, const void* value, size_t bytes);
  /* Waits up to `timeoutSeconds` for `key` to be set, then copies at most
   * `capacity` bytes of its value to `value` and writes the value's full
   * length to *bytes. Returns braidSuccess, braidTimeout when the key was not
   * set in time, or another error code. */
  braidResult_t (*get)(void* context, const char* key, void* value, size_t capacity, size_t* bytes,
                       double timeoutSeconds);
} braidStore_t;

/* braid extension: braidCommInitRank with the unique id handed out through
 * `store`. Rank 0 calls braidGetUniqueId and sets the key
 * "<keyPrefix>braid/uniqueId" to its 128 bytes; every other rank gets that
 * key, waiting up to BRAID_TIMEOUT seconds for it, then all call
 * braidCommInitRank. That is the only key used. A value left under the key
 * by an earlier run makes the ranks that read it fail (braidTimeout or
 * braidRemoteError): give each run a fresh store or prefix.
 * Errors: braidInvalidArgument (NULL comm, store, set or get; nranks < 1;
 * rank out of range; a callback that returned a value which is not an error
 * code), braidTimeout (the key did not appear in time), braidInvalidUsage
 * (the key's value is not 128 bytes), a callback's own error code (the
 * message names the key and the callback), and the errors of
 * braidGetUniqueId and braidCommInitRank. */
braidResult_t braidCommInitRankWithStore(braidComm_t* comm, int nranks, const braidStore_t* store,
                                         int rank);

/* Collective over `comm`: ranks with the same `color` form a new
 * communicator, ordered by `key`, ties broken by rank in `comm`. A rank with
 * color < 0 takes part but gets *newcomm = NULL.
 * Errors: braidInvalidArgument (NULL comm/newcomm), braidInvalidUsage
 * (aborted comm), and the errors of a collective. */
braidResult_t braidCommSplit(braidComm_t comm, int color, int key, braidComm_t* newcomm);

/* Waits for this rank's outstanding work on `comm` (its streams, and calls
 * other threads are making on it, included), then frees everything but the
 * stream handles, which stay valid until braidStreamDestroy: they hold only
 * their thread, and whatever is queued on them later fails (callbacks are
 * told braidInvalidUsage). Never waits for other ranks. NULL is a no-op. */
braidResult_t braidCommDestroy(braidComm_t comm);

/* Callable from any thread; returns within a second. This rank's in-flight
 * calls on `comm` return braidInvalidUsage ("communicator aborted"), so do
 * later calls; its connections are closed, so peers that need this rank see
 * braidRemoteError. Never waits for other ranks. Only braidCommDestroy
 * remains valid on the handle afterwards. */
braidResult_t braidCommAbort(braidComm_t comm);

/* Writes the first error of an asynchronous call on `comm` (one queued on a
 * stream), or braidSuccess; braidInvalidUsage once `comm` was aborted.
 * Errors: braidInvalidArgument (NULL). */
braidResult_t braidCommGetAsyncError(braidComm_t comm, braidResult_t* asyncError);

/* braid extension, as ncclCommRegister: declares that [buff, buff + size)
 * stays allocated and mapped until braidCommDeregister(comm, *handle), so
 * that a transport may register it with a device once and use that for
 * every call. Over RDMA, large messages from a declared buffer cross with an
 * RDMA read by the receiver (straight into its buffer if that is declared
 * too) instead of through the connection's rings; undeclared memory always
 * works, through the rings. Only memory braid is told stays the same is
 * cached: memory freed and allocated again at one address would otherwise
 * be sent from stale pages. Deregister only when no call using the buffer
 * is in flight. Local: no other rank takes part.
 * Errors: braidInvalidArgument (NULL comm, buff or handle, size 0). */
braidResult_t braidCommRegister(braidComm_t comm, void* buff, size_t size, void** handle);

/* Ends a braidCommRegister declaration; the device registrations made for
 * it are released by the transports before their next use of declared
 * memory. Errors: braidInvalidArgument (NULL comm, a handle that is not a
 * live registration of `comm`). */
braidResult_t braidCommDeregister(braidComm_t comm, void* handle);

/* braid extension, for host memory as ncclMemAlloc is for GPU memory:
 * allocates `size` bytes of zeroed, page-aligned host memory that the other
 * ranks of this host read in place. A large message from it to a rank of
 * the same host is copied once with memcpy through a mapping of the
 * allocation, instead of with process_vm_readv (about twice as fast on the
 * hosts measured, docs/PERFORMANCE.md); any other use is ordinary memory.
 * Not tied to a communicator; thread-safe. A process forked later shares
 * these pages with its parent rather than copying them on write. Free it
 * with braidHostFree once no call using it is in flight.
 * Errors: braidInvalidArgument (NULL ptr, size 0), braidSystemError (out of
 * memory, with the reason). */
braidResult_t braidHostAlloc(void** ptr, size_t size);

/* Frees memory of braidHostAlloc; NULL does nothing.
 * Errors: braidInvalidArgument (a pointer braidHostAlloc did not return, or
 * one already freed). */
braidResult_t braidHostFree(void* ptr);

/* braid extension, as ncclMemAlloc: allocates `size` bytes of GPU memory
 * (not zeroed) on the GPU of the calling thread's current CUDA context (GPU
 * 0 where it has none), which the other ranks of this host read in place:
 * a large message from it to a rank of the same host crosses once, copied
 * or reduced by the receiver straight out of it, instead of through
 * cuda_ipc's slots (BRAID_CUDA_IPC_DIRECT_BYTES, docs/GPU.md). It is cuMem
 * memory exported as a file descriptor, which a peer maps: the peer's
 * mapping keeps it alive, so unlike a cudaMalloc buffer read in place it
 * may be freed whenever no call using it is in flight; each peer that
 * mapped it is told and unmaps it at its next call, and keeps its pages on
 * the GPU until then. Each live allocation holds a file descriptor of the
 * process. Where the GPU or driver cannot export such memory (or the
 * descriptors run out) it is cuMemAlloc memory that moves through the
 * slots, logged at WARN. Any other use is ordinary GPU memory. Not tied to
 * a communicator; thread-safe. Free it with braidMemFree.
 * Errors: braidInvalidArgument (NULL ptr, size 0), braidNotSupported (a
 * build without CUDA, or a process that has not loaded the CUDA driver),
 * braidUnhandledCudaError (the driver's, with its message). */
braidResult_t braidMemAlloc(void** ptr, size_t size);

/* Frees memory of braidMemAlloc; NULL does nothing.
 * Errors: braidInvalidArgument (a pointer braidMemAlloc did not return, or
 * one already freed), braidUnhandledCudaError. */
braidResult_t braidMemFree(void* ptr);

/* Number of ranks in `comm`. Errors: braidInvalidArgument (NULL). */
braidResult_t braidCommCount(braidComm_t comm, int* count);

/* This process's rank in `comm`. Errors: braidInvalidArgument (NULL). */
braidResult_t braidCommUserRank(braidComm_t comm, int* rank);

/* braid extension: the name of the algorithm that served this rank's latest
 * call of `collective` on `comm` ("allreduce", "broadcast", "reduce",
 * "allgather", "reducescatter", "alltoall", "gather", "scatter", "barrier"),
 * or "" before the first such call. The string is static. With
 * BRAID_DEBUG=TRACE every call also logs its algorithm.
 * Errors: braidInvalidArgument (NULL pointer, unknown collective name). */
braidResult_t braidCommGetLastAlgorithm(braidComm_t comm, const char* collective,
                                        const char** algorithm);

/* braid extension: seconds a call on `comm` may make no progress (no byte
 * moved for it) before it returns braidTimeout; calls already running keep
 * the value they started with. Default: BRAID_TIMEOUT (300).
 * Errors: braidInvalidArgument (NULL comm, seconds not in (0, 1e7]). */
braidResult_t braidCommSetTimeout(braidComm_t comm, double seconds);

/* braid extension: the transport that carries this rank's messages to `peer`
 * in `comm`: "shm" (shared memory, ranks of one host), "tcp", or "self" for
 * peer == this rank. The string is static. BRAID_DEBUG=INFO logs the same
 * table at init. Errors: braidInvalidArgument (NULL pointer, peer out of
 * range). */
braidResult_t braidCommGetTransport(braidComm_t comm, int peer, const char** transport);

/* ---------------------------------------------------------------------------
 * Collectives. Every rank of `comm` calls the same collective with the same
 * count, datatype, op and root, in the same order. Errors common to all:
 * braidInvalidArgument (NULL comm; datatype, op or root out of range; NULL
 * buffer with count > 0; overlapping buffers where not allowed),
 * braidInvalidUsage (mismatched calls, aborted communicator), braidTimeout,
 * braidRemoteError, braidNotSupported (GPU memory where this build cannot serve
 * it), braidUnhandledCudaError (a failed copy of GPU memory, with CUDA's
 * message).
 *
 * GPU buffers (CUDA device or managed memory): a CUDA build serves them in
 * calls with stream NULL outside a group, through host memory. The call
 * waits for all work queued on the buffer's GPU, copies the buffers it
 * reads to host memory, runs, copies the result back and waits for that
 * copy. On a braid stream, in a group, or in a build without CUDA they are
 * refused with braidNotSupported.
 * ------------------------------------------------------------------------- */

/* recvbuff[i] = op over ranks of sendbuff[i], for i < count, on every rank.
 * In place when sendbuff == recvbuff. */
braidResult_t braidAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, braidRedOp_t op, braidComm_t comm,
                             braidStream_t stream);

/* Copies root's sendbuff into every rank's recvbuff (the root's too).
 * sendbuff matters only at the root. In place when sendbuff == recvbuff. */
braidResult_t braidBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                             braidDataType_t datatype, int root, braidComm_t comm,
                             braidStream_t stream);

/* Like braidAllReduce, with the result only in root's recvbuff; recvbuff
 * matters only at the root. In place when sendbuff == recvbuff. */
braidResult_t braidReduce(const void* sendbuff, void* recvbuff, size_t count,
                          braidDataType_t datatype, braidRedOp_t op, int root, braidComm_t comm,
                          braidStream_t stream);

/* recvbuff (nranks * sendcount elements) receives every rank's sendbuff in
 * rank order. In place when sendbuff == recvbuff + rank * sendcount. */
braidResult_t braidAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                             braidDataType_t datatype, braidComm_t comm, braidStream_t stream);

/* sendbuff holds nranks * recvcount elements; rank r receives the reduction
 * over ranks of part r. In place when recvbuff == sendbuff + rank * recvcount. */
braidResult_t braidReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                 braidDataType_t datatype, braidRedOp_t op, braidComm_t comm,
                                 braidStream_t stream);

/* Rank r sends part j (count elements) of sendbuff to rank j, which stores it
 * as part r of recvbuff; both hold nranks * count elements. Never in place:
 * overlapping buffers return braidInvalidArgument. */
braidResult_t braidAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                            braidDataType_t datatype, braidComm_t comm, braidStream_t stream);

/* root's recvbuff (nranks * sendcount elements) receives every rank's
 * sendbuff in rank order; recvbuff matters only at the root. In place at the
 * root when sendbuff == recvbuff + root * sendcount. */
braidResult_t braidGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                          braidDataType_t datatype, int root, braidComm_t comm,
                          braidStream_t stream);

/* Rank r receives part r of root's sendbuff (nranks * recvcount elements);
 * sendbuff matters only at the root. In place at the root when
 * recvbuff == sendbuff + root * recvcount. */
braidResult_t braidScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                           braidDataType_t datatype, int root, braidComm_t comm,
                           braidStream_t stream);

/* Returns once every rank has entered the barrier. */
braidResult_t braidBarrier(braidComm_t comm, braidStream_t stream);

/* ---------------------------------------------------------------------------
 * Point to point. A Send matches the Recv of `peer` with the same position
 * in the sequence of calls between the two ranks; count and datatype must
 * agree (else braidInvalidUsage). peer == own rank is allowed inside a group.
 * Errors: braidInvalidArgument (peer out of range; self outside a group).
 * ------------------------------------------------------------------------- */

braidResult_t braidSend(const void* sendbuff, size_t count, braidDataType_t datatype, int peer,
                        braidComm_t comm, braidStream_t stream);
braidResult_t braidRecv(void* recvbuff, size_t count, braidDataType_t datatype, int peer,
                        braidComm_t comm, braidStream_t stream);

/* ---------------------------------------------------------------------------
 * Group calls (per thread, nestable). Calls between the outermost
 * braidGroupStart and braidGroupEnd are checked and queued; braidGroupEnd
 * runs them together, so any pattern of Send/Recv inside one group (a ring,
 * an all-to-all) completes without deadlock. Calls on a stream are run on
 * that stream; the rest are run by braidGroupEnd, which returns when they
 * are complete. braidGroupEnd returns the first error of the group. A call
 * of the group that was refused (its own error, say braidInvalidArgument)
 * makes braidGroupEnd return that error and run none of the group's calls,
 * as NCCL does: the rest alone would post half of an exchange.
 * A group's one collective (beside any Send and Recv) runs as it would
 * alone, first: peers may make it in a group or not. Several collectives in
 * a group must be grouped alike on every rank.
 * Errors: braidInvalidUsage (braidGroupEnd without braidGroupStart).
 * ------------------------------------------------------------------------- */

braidResult_t braidGroupStart(void);
braidResult_t braidGroupEnd(void);

/* ---------------------------------------------------------------------------
 * Streams
 * ------------------------------------------------------------------------- */

/* A host stream of `comm`: a braid-owned thread that runs the calls queued
 * on it in order. Calls on different streams of one communicator run
 * concurrently; every rank must create its streams on `comm` in the same
 * order, and calls on the k-th stream match the k-th stream of the peers.
 * A communicator holds at most 125 streams.
 * Errors: braidInvalidArgument (NULL), braidInvalidUsage (aborted comm, or
 * a 126th stream). */
braidResult_t braidStreamCreate(braidComm_t comm, braidStream_t* stream);

/* A stream of `comm` whose calls are ordered on the CUDA stream `cudaStream`
 * (a cudaStream_t or CUstream of the driver the process loaded), as NCCL's
 * calls are: a call on it returns at once, runs after the work queued on
 * the CUDA stream before it, and the work queued after it sees its result.
 * Host and GPU buffers both (GPU ones staged through host memory). Its
 * errors come back from braidStreamSynchronize and braidCommGetAsyncError
 * (braidUnhandledCudaError with CUDA's message for a failed CUDA stream);
 * the CUDA stream is let go after a failed call too, never left waiting.
 * Not yet in a group (braidNotSupported). Same numbering and limits as
 * braidStreamCreate.
 * Errors: braidNotSupported (a build without CUDA, or no CUDA driver
 * loaded), braidUnhandledCudaError, as braidStreamCreate otherwise. */
braidResult_t braidStreamCreateFromCuda(braidComm_t comm, void* cudaStream, braidStream_t* stream);

/* Waits until every call queued on `stream` has finished; returns the first
 * error among them (and keeps returning it). */
braidResult_t braidStreamSynchronize(braidStream_t stream);

/* braidSuccess when every queued call has finished, braidInProgress while
 * some has not, or the first error among them. Never blocks. */
braidResult_t braidStreamQuery(braidStream_t stream);

/* Waits for the queued calls, then frees the stream. NULL is a no-op. */
braidResult_t braidStreamDestroy(braidStream_t stream);

/* braid extension: a function that braidStreamAddCallback runs on a
 * stream's thread. `status` is braidSuccess when every call queued on the
 * stream before it succeeded, else the stream's first error, whose message
 * braidGetLastError(NULL) returns inside the callback. */
typedef void (*braidStreamCallback_t)(braidStream_t stream, braidResult_t status, void* userData);

/* braid extension: queues `callback(stream, status, userData)` on `stream`,
 * as cudaLaunchHostFunc does on a CUDA stream: it runs on the stream's
 * thread after every call queued before it has finished, successfully or
 * not, and before any call queued after it. It runs after an error too, so
 * whoever waits on it learns the outcome; braidStreamSynchronize,
 * braidStreamDestroy and braidCommDestroy wait for it like for a call. A
 * callback may queue calls and callbacks on any stream, but must not wait
 * for its own stream: braidStreamSynchronize and braidStreamDestroy of it,
 * and braidCommDestroy of its communicator, return braidInvalidUsage there.
 * Later calls on the stream wait while it runs, so keep it short.
 * Errors: braidInvalidArgument (NULL or dead stream, NULL callback),
 * braidInvalidUsage (inside a group, where the group's calls reach the
 * stream only at braidGroupEnd: add the callback after it). */
braidResult_t braidStreamAddCallback(braidStream_t stream, braidStreamCallback_t callback,
                                     void* userData);

#ifdef __cplusplus
}
#endif

#endif /* BRAID_H_ */
