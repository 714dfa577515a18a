// A communicator: this rank's place in a group, its connections to every
// peer, and the bookkeeping that keeps calls apart (sequence numbers per
// stream, point-to-point counters per peer). Calls are planned by the
// algorithms and executed by the progress engine.
#pragma once

#include <sys/eventfd.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "algorithms/collective.h"
#include "src/bootstrap.h"
#include "src/common/env.h"
#include "src/common/status.h"
#include "src/gpu_path.h"
#include "src/online_tuner.h"
#include "src/progress.h"
#include "src/selector.h"
#include "transports/memory_registry.h"
#include "transports/tcp/tcp_transport.h"
#include "transports/transport.h"

namespace braid {

class BoardCollectives;

// One operation of a call or a group: a collective, or one Send or Recv.
struct Operation {
  algo::CollectiveArgs args;  // kind kSendRecv for point to point
  const void* send = nullptr;
  void* recv = nullptr;
  int peer = -1;  // point to point only
  bool isSend = false;
  std::string name;  // "braidAllReduce"
  // The algorithm to use; null: the selector's choice.
  const algo::Algorithm* algorithm = nullptr;
  // >= 0: send and recv are memory of this GPU, and the call runs as GPU
  // jobs (src/gpu_path.h); only where gpuJobsPossible() (a collective) or
  // gpuSendRecvPossible() (a Send or Recv).
  int gpuOrdinal = -1;
};

// A Send/Recv above BRAID_CHUNK_BYTES crosses in pieces of this size: the
// chunk, or larger where the message would make more than
// kMostSendRecvPieces. Each piece costs a host transport a message (and
// shm's single copy a handshake) while a few already let a GPU end's
// copies overlap the wire. Every rank cuts alike: it depends on the sizes.
inline constexpr size_t kMostSendRecvPieces = 8;
size_t sendRecvPieceBytes(size_t bytes, size_t chunkBytes);

// A Send or Recv of raw bytes, for braid's own traffic (split, link probe).
Operation byteTransfer(bool isSend, int peer, void* data, size_t bytes, std::string name);

class Communicator : public std::enable_shared_from_this<Communicator> {
 public:
  // `parentLink`: the cost model of the communicator this one was split
  // from, when all of that one's ranks share one host; taken instead of
  // probing the same links again (src/link_probe.h). `endedBy`: a flag
  // (the parent's abort) that ends the waits for the other ranks at once.
  static Result<std::shared_ptr<Communicator>> create(const RendezvousInfo& rendezvous, int nranks,
                                                      int rank, Config config,
                                                      const algo::LinkModel* parentLink = nullptr,
                                                      const std::atomic<bool>* endedBy = nullptr);
  ~Communicator();

  // The streams of the link probe, never a user's: the probe's ring of ranks
  // uses the first, ranks 0 and 1 alone the second, so that neither's calls
  // advance a sequence number kept by ranks that do not take part.
  static constexpr int kProbeStream = 127;
  static constexpr int kPairProbeStream = 126;
  // A user's streams are 0 to kMaxStreams.
  static constexpr int kMaxStreams = kPairProbeStream - 1;
  // Streams 0 to kBoardStreams - 1 have a lane of the shared-memory board:
  // the caller's thread and the first three streams a program creates (a
  // framework's collective and point-to-point streams among them).
  static constexpr int kBoardStreams = 4;

  int rank() const { return rank_; }
  // How long a host stream's worker with nothing queued, and a thread that
  // waits for a stream, poll before they sleep (src/stream.h).
  double streamSpinSeconds() const { return streamSpinSeconds_; }
  int size() const { return nranks_; }
  const Config& config() const { return config_; }
  transport::MemoryRegistry& registry() { return *registry_; }

  // Runs the operations of one call or group to completion on `stream`
  // (0 = the caller's thread, k = the k-th stream created on this
  // communicator). The operations of several communicators that must
  // progress together (one group) go through runTogether().
  Status run(std::span<const Operation> ops, int stream);
  static Status runTogether(std::span<std::pair<Communicator*, std::vector<Operation>>> batches);

  Result<std::shared_ptr<Communicator>> split(int color, int key);

  // Any thread, never blocks on peers: pending and later calls fail.
  void abort();
  bool aborted() const { return aborted_.load(); }
  const std::atomic<bool>& abortedFlag() const { return aborted_; }
  // Closes the connections after local work is done (braidCommDestroy).
  void shutdown();

  Result<int> newStreamIndex();
  void recordAsyncError(const Status& s);
  ErrorCode asyncError() const;

  // The algorithm that served the latest call of `kind` (for tests, TRACE).
  std::string_view lastAlgorithm(algo::CollectiveKind kind) const;
  const Selector& selector() const { return selector_; }
  // Seconds a call may make no progress (BRAID_TIMEOUT until set here).
  void setTimeout(double seconds) { timeoutSeconds_.store(seconds); }
  double timeout() const { return timeoutSeconds_.load(); }
  // How many ranks of this communicator share `rank`'s host (itself included).
  int ranksOnHostOf(int rank) const { return hostShares_[rank].ranks; }
  // Logical CPUs the ranks of `rank`'s host may run on, all of them together.
  int coresOnHostOf(int rank) const { return hostShares_[rank].cores; }
  // "shm", "tcp" or "self": what carries messages to `peer` (static string).
  const char* transportTo(int peer) const { return transportNames_[peer]; }
  // Whether collectives on GPU device memory run as GPU jobs (gpu_path.h):
  // a CUDA build, and either BRAID_GPU_STAGING=pipelined or BRAID_CUDA_IPC=1
  // with every rank on this host. Every rank reaches the same verdict.
  bool gpuJobsPossible() const;
  // Whether `op` is a GPU job whose schedule pipelines in cuda_ipc's slot
  // size (gpuChunkBytes), not BRAID_CHUNK_BYTES: GPU memory, a CUDA build,
  // and BRAID_CUDA_IPC=1 with every rank on this host. Alike on every rank.
  bool gpuJobsInSlots(const Operation& op) const;
  // A CUDA build with BRAID_CUDA_IPC=1 and every rank on this host: GPU jobs
  // reach every peer over cuda_ipc. Every rank reaches the same verdict.
  bool everyPeerOverCudaIpc() const;
  // Whether a Send or Recv of GPU device memory runs as a GPU job, its
  // pieces staged through pinned host memory (gpu_path.h): a CUDA build,
  // two or more ranks and BRAID_GPU_STAGING=pipelined. Decided by each rank
  // alone: the wire does not depend on it.
  bool gpuSendRecvPossible() const;
  // Makes now, on the calling thread, what the GPU jobs among `ops` (those
  // with a gpuOrdinal, in the order run() will get them on stream
  // `streamIndex`) allocate: the GPU path, if not made yet, and scratch as
  // large as their schedules need. A call on a CUDA stream does so before
  // the stream waits for it, since allocating memory then could wait for
  // good (docs/GPU.md).
  Status prepareGpuCalls(std::span<const Operation> ops, int streamIndex);

 private:
  Communicator(int rank, int nranks, Config config);

  // A planned and fused schedule, kept for the next call with the same
  // arguments: training loops and benchmarks repeat a few calls, and
  // planning costs more than a small message's transfer.
  struct CachedPlan {
    algo::CollectiveArgs args;
    // What the call asked for: an algorithm, or null for the model's choice
    // (looked up without consulting the model again, which costs more
    // than the rest of a small call's bookkeeping).
    const algo::Algorithm* requested = nullptr;
    const algo::Algorithm* algorithm = nullptr;
    // Messages split into pieces of this size (0: not split).
    size_t pieceBytes = 0;
    // Shares ownership of the index: a call keeps both alive even if the
    // cache drops the plan meanwhile.
    std::shared_ptr<const algo::Schedule> schedule;
    const ScheduleIndex* index = nullptr;
  };
  static constexpr size_t kCachedPlans = 8;

  struct StreamState {
    std::mutex order;       // one call at a time per stream keeps tags increasing
    uint32_t sequence = 0;  // collectives issued on this stream
    std::map<int, uint64_t> sentTo, receivedFrom;  // point-to-point counters
    // Host scratch of the n-th call of a batch that needs some, kept for
    // the next batch: a fresh buffer costs its page faults on every call.
    std::vector<std::vector<uint8_t>> scratch;
    std::vector<CachedPlan> plans;  // at most kCachedPlans, most recent last
  };
  StreamState& stream(int index);
  // The number of the stream's next collective call; every
  // kForgetArrivalsEvery calls, the connections forget latest arrivals
  // before it (src/call_tags.h).
  uint32_t takeCallNumber(StreamState& st, int streamIndex);
  // The algorithm and fused schedule for `args`, from the stream's cache or
  // new: `requested`, or the selector's choice when it is null; with its
  // messages split into pieces of `pieceBytes` unless 0.
  const CachedPlan& planFor(StreamState& st, const algo::CollectiveArgs& args,
                            const algo::Algorithm* requested, size_t pieceBytes = 0);
  // One call without a group: timed when the online tuner is trying
  // algorithms for its size (measureAlgorithms_).
  Status runTuned(const Operation& op, int stream);
  Status runPlain(std::span<const Operation> ops, int stream);
  // Sets up board_ when every rank shares this host over shared memory
  // (a few collectives of its own; every rank reaches the same verdict).
  Status setUpBoard();
  Status runOnBoard(const Operation& op, int stream);
  // The GPU path for calls on GPU `deviceOrdinal`, made at the first; one
  // GPU per rank.
  Result<GpuPath*> gpuPathFor(int deviceOrdinal);
  // Fails a GPU call this rank cannot run, and every peer's with it (their
  // connections are aborted with the reason): `why`, with `code`.
  Status failGpuJobs(ErrorCode code, std::string why);

  // A collective's arguments as this rank plans it.
  algo::CollectiveArgs planArgs(const Operation& op) const;
  // What a GPU call of `algorithm` for `args`, its messages cut into pieces
  // of `pieceBytes` (0: whole), needs made before a CUDA stream waits for
  // it: its GPU scratch, and for each peer the sizes of its largest
  // messages each way, at most kReservedMessages of them, largest first.
  struct GpuCallNeeds {
    struct Peer {
      int rank;
      std::vector<size_t> sends, recvs;
    };
    algo::CollectiveArgs args;
    const algo::Algorithm* algorithm = nullptr;
    size_t pieceBytes = 0;
    size_t scratchBytes = 0;
    std::vector<Peer> peers;
  };
  // More than a connection holds in flight each way.
  static constexpr size_t kReservedMessages = 16;
  // The last kCachedPlans answers are kept.
  std::shared_ptr<const GpuCallNeeds> gpuCallNeeds(const algo::CollectiveArgs& args,
                                                   const algo::Algorithm& algorithm,
                                                   size_t pieceBytes);

  // Builds the jobs of `ops` (caller holds the stream's order lock).
  Status prepare(std::span<const Operation> ops, int streamIndex, std::vector<Job>* jobs,
                 std::vector<std::shared_ptr<const algo::Schedule>>* schedules);

  const int rank_, nranks_;
  const Config config_;
  // braidCommRegister's buffers, read by the transports that can use them.
  const std::shared_ptr<transport::MemoryRegistry> registry_ =
      std::make_shared<transport::MemoryRegistry>();
  std::unique_ptr<tcp::TcpTransport> tcp_;
  std::vector<std::unique_ptr<transport::Connection>> owned_;
  std::vector<transport::Connection*> connections_;  // by rank
  // GPU jobs' device and connections, made at the first (after owned_: its
  // connections use those, so it goes first).
  std::mutex gpuPathMutex_;
  std::unique_ptr<GpuPath> gpuPath_;
  std::vector<const char*> transportNames_;  // by rank
  std::vector<topo::HostShare> hostShares_;  // by rank
  std::vector<bool> sameHost_;               // by rank: shares this rank's host
  // Whether calls time the model's shortlist and keep the fastest
  // (BRAID_TUNE=measure).
  bool measureAlgorithms_ = false;
  std::mutex tunerMutex_;
  OnlineTuner tuner_;
  double spinSeconds_ = 0;
  double pureSpinSeconds_ = 0;    // set once the ranks per host are known
  double streamSpinSeconds_ = 0;  // likewise
  Selector selector_;
  std::mutex gpuCallNeedsMutex_;
  std::vector<std::shared_ptr<const GpuCallNeeds>> gpuCallNeeds_;  // most recent last
  // Tiny AllReduce and Barrier on stream 0 when all ranks share a host.
  std::unique_ptr<BoardCollectives> board_;
  // Set when a board call failed: the board serves no more calls (the
  // communicator is broken on this rank, as after any failed call), while
  // other streams may still be reading it.
  std::atomic<bool> boardBroken_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<double> timeoutSeconds_{300};
  int abortFd_ = -1;
  std::mutex streamsMutex_;
  std::map<int, std::unique_ptr<StreamState>> streams_;
  int nextStream_ = 1;
  std::atomic<int> asyncError_{0};
  // By CollectiveKind; written on every call, so no lock.
  std::array<std::atomic<const algo::Algorithm*>,
             static_cast<size_t>(algo::CollectiveKind::kSendRecv)>
      lastAlgorithm_{};
};

}  // namespace braid
