// What it costs to hand work from one process to another on one GPU: the
// unit of a GPU job between ranks that share a GPU (docs/GPU.md). Two
// processes (forked before either touches CUDA) take turns: each, when its
// peer says over a socket that it queued its part, queues a 4-byte memset
// and a record of its own interprocess event, then says so. The time per
// turn is printed for each way of waiting for the peer's part:
//
//   stream      the stream waits for the peer's event (cuStreamWaitEvent),
//               as cuda_ipc does; the host never waits for the GPU;
//   host        the host polls the peer's event (cudaEventQuery) before
//               queueing, so no stream ever waits on another process;
//   host-idle   as host, and each process also waits for its own part to
//               run before saying so: one process has work at a time;
//   one-process the same turns between two streams of one process, where
//               no switch between processes happens (the baseline).
//
//   gpu_handoff [turns]     (default 2000)
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

bool ok(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return true;
  std::fprintf(stderr, "gpu_handoff: %s: %s\n", what, cudaGetErrorString(error));
  return false;
}

bool sendAll(int fd, const void* data, size_t bytes) {
  return write(fd, data, bytes) == static_cast<ssize_t>(bytes);
}
bool readAll(int fd, void* data, size_t bytes) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = read(fd, p, bytes);
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

enum class Wait { kStream, kHost, kHostIdle };

// One side's part in `turns` turns; the side with `first` starts. Returns
// the seconds from its first turn to its last, or a negative number.
double takeTurns(int fd, bool first, Wait wait, int turns, cudaStream_t stream, int* word,
                 cudaEvent_t mine, cudaEvent_t peers) {
  char token = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int turn = 0; turn < turns; ++turn) {
    if (turn > 0 || !first) {
      if (!readAll(fd, &token, 1)) return -1;
      if (wait == Wait::kStream) {
        if (!ok(cudaStreamWaitEvent(stream, peers, 0), "cudaStreamWaitEvent")) return -1;
      } else {
        cudaError_t state;
        while ((state = cudaEventQuery(peers)) == cudaErrorNotReady) {
        }
        if (!ok(state, "cudaEventQuery")) return -1;
      }
    }
    if (!ok(cudaMemsetAsync(word, turn & 0xff, sizeof(int), stream), "cudaMemsetAsync") ||
        !ok(cudaEventRecord(mine, stream), "cudaEventRecord"))
      return -1;
    if (wait == Wait::kHostIdle && !ok(cudaEventSynchronize(mine), "cudaEventSynchronize"))
      return -1;
    if (!sendAll(fd, &token, 1)) return -1;
  }
  // The first side ends with the peer's last turn, so that no token is left
  // over for the next way of waiting.
  if (first && !readAll(fd, &token, 1)) return -1;
  if (!ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize")) return -1;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One process's side: its stream, word and event, the peer's event opened
// from the handle that comes over `fd`; then every way of waiting.
int side(int fd, bool first, int turns) {
  cudaStream_t stream;
  int* word = nullptr;
  cudaEvent_t mine, peers;
  cudaIpcEventHandle_t handle, peerHandle;
  if (!ok(cudaSetDevice(0), "cudaSetDevice") ||
      !ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream") ||
      !ok(cudaMalloc(&word, sizeof(int)), "cudaMalloc") ||
      !ok(cudaEventCreateWithFlags(&mine, cudaEventInterprocess | cudaEventDisableTiming),
          "event") ||
      !ok(cudaIpcGetEventHandle(&handle, mine), "cudaIpcGetEventHandle") ||
      !sendAll(fd, &handle, sizeof(handle)) || !readAll(fd, &peerHandle, sizeof(peerHandle)) ||
      !ok(cudaIpcOpenEventHandle(&peers, peerHandle), "cudaIpcOpenEventHandle"))
    return 1;
  // The peer's event must have been recorded once before any wait for it.
  if (!ok(cudaEventRecord(mine, stream), "record") || !ok(cudaStreamSynchronize(stream), "sync"))
    return 1;
  char token = 0;
  if (!sendAll(fd, &token, 1) || !readAll(fd, &token, 1)) return 1;
  const struct {
    Wait wait;
    const char* name;
  } ways[] = {{Wait::kStream, "stream"}, {Wait::kHost, "host"}, {Wait::kHostIdle, "host-idle"}};
  for (const auto& way : ways) {
    // A warm-up first; a side that fails closes its socket, which ends the
    // other's wait.
    if (takeTurns(fd, first, way.wait, turns / 10, stream, word, mine, peers) < 0) return 1;
    const double seconds = takeTurns(fd, first, way.wait, turns, stream, word, mine, peers);
    if (seconds < 0) return 1;
    // Each side's turns interleave with the other's: 2 * turns handoffs.
    if (first)
      std::printf("%-11s %8.1f us a turn (2 processes, %d turns each)\n", way.name,
                  seconds * 1e6 / (2.0 * turns), turns);
  }
  return 0;
}

// The same turns between two streams of this process, with stream waits.
int oneProcess(int turns) {
  cudaStream_t a, b;
  cudaEvent_t ea, eb;
  int* word = nullptr;
  if (!ok(cudaSetDevice(0), "cudaSetDevice") ||
      !ok(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "stream") ||
      !ok(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream") ||
      !ok(cudaEventCreateWithFlags(&ea, cudaEventDisableTiming), "event") ||
      !ok(cudaEventCreateWithFlags(&eb, cudaEventDisableTiming), "event") ||
      !ok(cudaMalloc(&word, sizeof(int)), "cudaMalloc"))
    return 1;
  const auto start = std::chrono::steady_clock::now();
  for (int turn = 0; turn < turns; ++turn) {
    cudaStreamWaitEvent(a, eb, 0);
    cudaMemsetAsync(word, turn & 0xff, sizeof(int), a);
    cudaEventRecord(ea, a);
    cudaStreamWaitEvent(b, ea, 0);
    cudaMemsetAsync(word, turn & 0xff, sizeof(int), b);
    cudaEventRecord(eb, b);
  }
  if (!ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 1;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%-11s %8.1f us a turn (2 streams of 1 process, %d turns each)\n", "one-process",
              seconds * 1e6 / (2.0 * turns), turns);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int turns = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (turns < 10) {
    std::fprintf(stderr, "usage: gpu_handoff [turns >= 10]\n");
    return 2;
  }
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
    std::perror("gpu_handoff: socketpair");
    return 1;
  }
  // Before any CUDA call: a process must not fork once it has a context.
  const pid_t child = fork();
  if (child < 0) {
    std::perror("gpu_handoff: fork");
    return 1;
  }
  if (child == 0) {
    close(fds[0]);
    _exit(side(fds[1], false, turns));
  }
  close(fds[1]);
  int failed = side(fds[0], true, turns);
  close(fds[0]);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    failed = 1;
  if (failed == 0) failed = oneProcess(turns);
  return failed;
}
