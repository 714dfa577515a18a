// braid_torch: braid as a torch.distributed backend (PyTorch 1.13's c10d
// ProcessGroup). `import braid_torch` registers the backend "braid"; then
// torch.distributed.init_process_group("braid", ...) bootstraps a braid
// communicator through the c10d Store it is handed
// (braidCommInitRankWithStore) and runs every collective on braid host
// streams. A Work completes from a stream callback (braidStreamAddCallback);
// its future, on which DDP chains its gradient division, completes there or
// on the group's completion thread (completion_thread.h).
//
// Only braid.h is used of braid. The Work is in braid_work.cc, the store
// callbacks in store_adapter.h; errors,
// dtype/op mapping and tensor checks in tensor_checks.cc.
#include <Python.h>
#include <braid.h>
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "braid_work.h"
#include "store_adapter.h"
#include "tensor_checks.h"

namespace braid_torch {
namespace {

constexpr const char* kBackendName = "braid";
// braidCommSetTimeout's largest, in seconds.
constexpr double kLongestTimeout = 1e7;
// Streams for send and recv: one per ordered pair of ranks, up to this
// many (8 ranks; each is a thread on every rank). Even.
constexpr int kMostPointToPointStreams = 56;

class ProcessGroupBraid : public c10d::ProcessGroup {
 public:
  ProcessGroupBraid(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::duration<float> timeout)
      : ProcessGroup(rank, size) {
    StoreAdapter adapter{store.get(), {}};
    braidStore_t callbacks{&adapter, nullptr, &StoreAdapter::set, &StoreAdapter::get};
    braidResult_t r = braidCommInitRankWithStore(&comm_, size, &callbacks, rank);
    if (r != braidSuccess) {
      std::string message = braidGetLastError(nullptr);
      if (!adapter.lastError.empty()) message += " (store: " + adapter.lastError + ")";
      throw braidError("creating the communicator of rank " + std::to_string(rank) + " of " +
                           std::to_string(size),
                       r, message.c_str());
    }
    try {
      // Longer than braid's longest is that longest: an "effectively
      // infinite" timedelta(days=200) is not a mistake to refuse.
      if (timeout.count() > 0)
        check(braidCommSetTimeout(comm_, std::min<double>(timeout.count(), kLongestTimeout)),
              "setting the timeout");
      // Collectives keep the order of the calls on one stream. Sends and
      // receives go on streams of their own, one per ordered pair of ranks
      // (what s sends to r goes on the stream of (s, r) at both ends), so
      // that messages between two ranks keep their order, a pending recv
      // holds up no collective, a recv from one rank no send to another
      // (irecv from the left, then isend to the right, on every rank of a
      // ring), and a send to one rank no send to another (a large one to a
      // rank that takes it late). Past kMostPointToPointStreams pairs, pairs
      // share them (pointToPointStream). Every rank creates them in this
      // order, as braid requires.
      check(braidStreamCreate(comm_, &collectives_), "creating a stream");
      const int64_t pairs = int64_t{size} * (size - 1);
      p2p_.resize(std::clamp<int64_t>(pairs, 1, kMostPointToPointStreams), nullptr);
      for (braidStream_t& stream : p2p_)
        check(braidStreamCreate(comm_, &stream), "creating a stream");
    } catch (...) {
      teardown();
      throw;
    }
    init();
  }

  ~ProcessGroupBraid() override {
    // Pending works may complete futures whose callbacks need the GIL.
    if (Py_IsInitialized() && PyGILState_Check()) {
      pybind11::gil_scoped_release release;
      teardown();
    } else {
      teardown();
    }
  }

  const std::string getBackendName() const override { return kBackendName; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const at::Tensor& t = single(tensors, "broadcast");
    checkCpu(t, "broadcast's tensor");
    auto work = newWork(c10d::OpType::BROADCAST, "braid:broadcast", {t});
    at::Tensor d = work->dense(t, true);
    int root = static_cast<int>(opts.rootRank);
    return submit(work, collectives_, "broadcast", [&](braidStream_t s) {
      return braidBroadcast(d.data_ptr(), d.data_ptr(), bytesOf(d), braidUint8, root, comm_, s);
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const at::Tensor& t = single(tensors, "allreduce");
    checkCpu(t, "allreduce's tensor");
    braidDataType_t type = reductionType(t);
    braidRedOp_t op = reductionOp(opts.reduceOp);
    auto work = newWork(c10d::OpType::ALLREDUCE, "braid:all_reduce", {t});
    at::Tensor d = work->dense(t, true);
    return submit(work, collectives_, "allreduce", [&](braidStream_t s) {
      return braidAllReduce(d.data_ptr(), d.data_ptr(), d.numel(), type, op, comm_, s);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const at::Tensor& t = single(tensors, "reduce");
    checkCpu(t, "reduce's tensor");
    braidDataType_t type = reductionType(t);
    braidRedOp_t op = reductionOp(opts.reduceOp);
    auto work = newWork(c10d::OpType::REDUCE, "braid:reduce", {t});
    at::Tensor d = work->dense(t, true);
    int root = static_cast<int>(opts.rootRank);
    return submit(work, collectives_, "reduce", [&](braidStream_t s) {
      return braidReduce(d.data_ptr(), d.data_ptr(), d.numel(), type, op, root, comm_, s);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    const at::Tensor& in = single(inputs, "allgather");
    checkCpu(in, "allgather's input");
    if (outputs.size() != 1) fail("allgather: expected one output list");
    checkParts(outputs[0], in, "allgather's output list");
    auto work = newWork(c10d::OpType::ALLGATHER, "braid:all_gather", outputs[0]);
    at::Tensor d = work->dense(in, false);
    at::Tensor gathered = at::empty({getSize(), in.numel()}, in.options());
    work->hold(gathered);
    work->onSuccess(scatterInto(outputs[0], gathered));
    return submit(work, collectives_, "allgather", [&](braidStream_t s) {
      return braidAllGather(d.data_ptr(), gathered.data_ptr(), bytesOf(d), braidUint8, comm_, s);
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    checkCpu(input, "_allgather_base's input");
    checkCpu(output, "_allgather_base's output");
    checkSameType(output, input, "_allgather_base");
    if (output.numel() != input.numel() * getSize())
      fail("_allgather_base: the output has " + std::to_string(output.numel()) +
           " elements, not world size * input's = " + std::to_string(input.numel() * getSize()));
    auto work = newWork(c10d::OpType::_ALLGATHER_BASE, "braid:_all_gather_base", {output});
    at::Tensor in = work->dense(input, false), out = work->dense(output, true);
    return submit(work, collectives_, "_allgather_base", [&](braidStream_t s) {
      return braidAllGather(in.data_ptr(), out.data_ptr(), bytesOf(in), braidUint8, comm_, s);
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const at::Tensor& in = single(inputs, "gather");
    checkCpu(in, "gather's input");
    int root = checkRoot(opts.rootRank, "gather");
    bool isRoot = root == getRank();
    if (isRoot) {
      if (outputs.size() != 1) fail("gather: the root expects one output list");
      checkParts(outputs[0], in, "gather's output list");
    } else if (!outputs.empty()) {
      fail("gather: only the root (rank " + std::to_string(root) + ") passes an output list");
    }
    auto work = newWork(c10d::OpType::GATHER, "braid:gather",
                        isRoot ? outputs[0] : std::vector<at::Tensor>{});
    at::Tensor d = work->dense(in, false);
    at::Tensor gathered;
    if (isRoot) {
      gathered = at::empty({getSize(), in.numel()}, in.options());
      work->hold(gathered);
      work->onSuccess(scatterInto(outputs[0], gathered));
    }
    return submit(work, collectives_, "gather", [&](braidStream_t s) {
      return braidGather(d.data_ptr(), isRoot ? gathered.data_ptr() : nullptr, bytesOf(d),
                         braidUint8, root, comm_, s);
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const at::Tensor& out = single(outputs, "scatter");
    checkCpu(out, "scatter's output");
    int root = checkRoot(opts.rootRank, "scatter");
    bool isRoot = root == getRank();
    if (isRoot) {
      if (inputs.size() != 1) fail("scatter: the root expects one input list");
      checkParts(inputs[0], out, "scatter's input list");
    } else if (!inputs.empty()) {
      fail("scatter: only the root (rank " + std::to_string(root) + ") passes an input list");
    }
    auto work = newWork(c10d::OpType::SCATTER, "braid:scatter", {out});
    at::Tensor d = work->dense(out, true);
    at::Tensor parts;
    if (isRoot) {
      parts = gatherFrom(*work, inputs[0], out);
    }
    return submit(work, collectives_, "scatter", [&](braidStream_t s) {
      return braidScatter(isRoot ? parts.data_ptr() : nullptr, d.data_ptr(), bytesOf(d), braidUint8,
                          root, comm_, s);
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor& out = single(outputs, "reduce_scatter");
    checkCpu(out, "reduce_scatter's output");
    if (inputs.size() != 1) fail("reduce_scatter: expected one input list");
    checkParts(inputs[0], out, "reduce_scatter's input list");
    braidDataType_t type = reductionType(out);
    braidRedOp_t op = reductionOp(opts.reduceOp);
    auto work = newWork(c10d::OpType::REDUCE_SCATTER, "braid:reduce_scatter", {out});
    at::Tensor d = work->dense(out, true);
    at::Tensor parts = gatherFrom(*work, inputs[0], out);
    return submit(work, collectives_, "reduce_scatter", [&](braidStream_t s) {
      return braidReduceScatter(parts.data_ptr(), d.data_ptr(), d.numel(), type, op, comm_, s);
    });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    checkCpu(input, "_reduce_scatter_base's input");
    checkCpu(output, "_reduce_scatter_base's output");
    checkSameType(output, input, "_reduce_scatter_base");
    if (input.numel() != output.numel() * getSize())
      fail("_reduce_scatter_base: the input has " + std::to_string(input.numel()) +
           " elements, not world size * output's = " + std::to_string(output.numel() * getSize()));
    braidDataType_t type = reductionType(output);
    braidRedOp_t op = reductionOp(opts.reduceOp);
    auto work = newWork(c10d::OpType::_REDUCE_SCATTER_BASE, "braid:_reduce_scatter_base", {output});
    at::Tensor in = work->dense(input, false), out = work->dense(output, true);
    return submit(work, collectives_, "_reduce_scatter_base", [&](braidStream_t s) {
      return braidReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), type, op, comm_, s);
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions&) override {
    checkCpu(input, "alltoall_base's input");
    checkCpu(output, "alltoall_base's output");
    checkSameType(output, input, "alltoall_base");
    auto work = newWork(c10d::OpType::ALLTOALL_BASE, "braid:all_to_all", {output});
    at::Tensor in = work->dense(input, false), out = work->dense(output, true);
    const int n = getSize();
    if (outputSplits.empty() && inputSplits.empty()) {
      if (in.numel() % n != 0 || out.numel() != in.numel())
        fail("alltoall_base: even splits need input and output of equal size divisible by " +
             std::string("the world size (") + std::to_string(n) + "), got " +
             std::to_string(in.numel()) + " and " + std::to_string(out.numel()) + " elements");
      // Whole rows, as gloo's: elements alone would cut a row in two.
      for (const at::Tensor* t : {&in, &out})
        if (t->dim() == 0 || t->size(0) % n != 0)
          fail("alltoall_base: even splits cut the first dimension into the world size (" +
               std::to_string(n) + ") parts, and it has " +
               std::to_string(t->dim() == 0 ? 0 : t->size(0)) + " rows");
      return submit(work, collectives_, "alltoall_base", [&](braidStream_t s) {
        return braidAllToAll(in.data_ptr(), out.data_ptr(), bytesOf(in) / n, braidUint8, comm_, s);
      });
    }
    // Uneven splits: one Send and one Recv per peer in a group, sizes in
    // rows of the first dimension (an empty split list means even rows).
    std::vector<size_t> sendOffsets, sendBytes, recvOffsets, recvBytes;
    rowParts(in, inputSplits, "input", &sendOffsets, &sendBytes);
    rowParts(out, outputSplits, "output", &recvOffsets, &recvBytes);
    auto* inBytes = static_cast<char*>(in.data_ptr());
    auto* outBytes = static_cast<char*>(out.data_ptr());
    return submit(work, collectives_, "alltoall_base", [&](braidStream_t s) {
      return grouped([&]() -> braidResult_t {
        for (int p = 0; p < n; ++p) {
          braidResult_t r =
              braidSend(inBytes + sendOffsets[p], sendBytes[p], braidUint8, p, comm_, s);
          if (r == braidSuccess)
            r = braidRecv(outBytes + recvOffsets[p], recvBytes[p], braidUint8, p, comm_, s);
          if (r != braidSuccess) return r;
        }
        return braidSuccess;
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    const int n = getSize();
    if (static_cast<int>(outputs.size()) != n || static_cast<int>(inputs.size()) != n)
      fail("alltoall: expected " + std::to_string(n) + " input and output tensors, got " +
           std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
    auto work = newWork(c10d::OpType::ALLTOALL, "braid:all_to_all", outputs);
    std::vector<at::Tensor> ins, outs;
    for (int p = 0; p < n; ++p) {
      checkCpu(inputs[p], "alltoall's input");
      checkCpu(outputs[p], "alltoall's output");
      checkSameType(outputs[p], inputs[p], "alltoall");
      ins.push_back(work->dense(inputs[p], false));
      outs.push_back(work->dense(outputs[p], true));
    }
    return submit(work, collectives_, "alltoall", [&](braidStream_t s) {
      return grouped([&]() -> braidResult_t {
        for (int p = 0; p < n; ++p) {
          braidResult_t r = braidSend(ins[p].data_ptr(), bytesOf(ins[p]), braidUint8, p, comm_, s);
          if (r == braidSuccess)
            r = braidRecv(outs[p].data_ptr(), bytesOf(outs[p]), braidUint8, p, comm_, s);
          if (r != braidSuccess) return r;
        }
        return braidSuccess;
      });
    });
  }

  // Sends and receives match by their order between two ranks; the tag is
  // not used.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int) override {
    const at::Tensor& t = single(tensors, "send");
    checkCpu(t, "send's tensor");
    auto work = newWork(c10d::OpType::SEND, "braid:send", {});
    at::Tensor d = work->dense(t, false);
    const int receiver = checkPeer(dstRank, "send");
    return submit(work, pointToPointStream(getRank(), receiver), "send", [&](braidStream_t s) {
      return braidSend(d.data_ptr(), bytesOf(d), braidUint8, dstRank, comm_, s);
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int) override {
    const at::Tensor& t = single(tensors, "recv");
    checkCpu(t, "recv's tensor");
    auto work = newWork(c10d::OpType::RECV, "braid:recv", {t});
    at::Tensor d = work->dense(t, true);
    return submit(work, pointToPointStream(checkPeer(srcRank, "recv"), getRank()), "recv",
                  [&](braidStream_t s) {
                    return braidRecv(d.data_ptr(), bytesOf(d), braidUint8, srcRank, comm_, s);
                  });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    auto work = newWork(c10d::OpType::BARRIER, "braid:barrier", {});
    return submit(work, collectives_, "barrier",
                  [&](braidStream_t s) { return braidBarrier(comm_, s); });
  }

  // batch_isend_irecv: the calls between start and end form one braid
  // group, so any pattern of sends and receives among them completes.
  void startCoalescing() override {
    if (coalescing_) fail("startCoalescing: already coalescing");
    check(braidGroupStart(), "braidGroupStart");
    coalescing_ = true;
  }

  void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>>&) override {
    if (!coalescing_) fail("endCoalescing without startCoalescing");
    coalescing_ = false;
    std::vector<std::pair<braidStream_t, c10::intrusive_ptr<BraidWork>>> pending =
        std::move(coalesced_);
    coalesced_.clear();
    check(braidGroupEnd(), "braidGroupEnd");
    for (auto& [stream, work] : pending) addCallback(stream, work, "coalesced call");
  }

 private:
  c10::intrusive_ptr<BraidWork> newWork(c10d::OpType type, const char* title,
                                        std::vector<at::Tensor> outputs) {
    if (!comm_) fail("the process group was shut down");
    return c10::make_intrusive<BraidWork>(getRank(), type, title, std::move(outputs), unfinished_,
                                          completions_.get());
  }

  // Queues the calls, then the callback that completes `work`.
  c10::intrusive_ptr<c10d::Work> submit(const c10::intrusive_ptr<BraidWork>& work,
                                        braidStream_t stream, const char* what,
                                        const std::function<braidResult_t(braidStream_t)>& calls) {
    // Staging copies in stream order: from a callback queued before the
    // calls; inside a group (batch_isend_irecv), where none can be, now.
    if (work->hasStarters()) {
      if (coalescing_) {
        work->runStarters();
      } else {
        auto* ref = new c10::intrusive_ptr<BraidWork>(work);
        braidResult_t r = braidStreamAddCallback(stream, &BraidWork::onStreamStart, ref);
        if (r != braidSuccess) {
          delete ref;
          check(r, what);
        }
      }
    }
    check(calls(stream), what);
    if (coalescing_)
      coalesced_.emplace_back(stream, work);  // completed after braidGroupEnd
    else
      addCallback(stream, work, what);
    return work;
  }

  void addCallback(braidStream_t stream, const c10::intrusive_ptr<BraidWork>& work,
                   const char* what) {
    auto* ref = new c10::intrusive_ptr<BraidWork>(work);
    braidResult_t r = braidStreamAddCallback(stream, &BraidWork::onStream, ref);
    if (r != braidSuccess) {
      delete ref;
      check(r, what);
    }
  }

  // Runs body inside a braid group (unless one is open: batch_isend_irecv),
  // and closes the group even when body failed.
  braidResult_t grouped(const std::function<braidResult_t()>& body) {
    braidResult_t r = braidGroupStart();
    if (r != braidSuccess) return r;
    braidResult_t inside = body();
    braidResult_t end = braidGroupEnd();
    return inside != braidSuccess ? inside : end;
  }

  // The stream that carries the messages `sender` sends to `receiver`: the
  // number of the unordered pair, and which way. Where pairs share streams
  // (past kMostPointToPointStreams), the two ways of one pair never do, so
  // irecv from a rank, then isend to it, on both, completes.
  braidStream_t pointToPointStream(int sender, int receiver) const {
    if (p2p_.size() < 2 || sender == receiver) return p2p_[0];
    const int64_t low = std::min(sender, receiver), high = std::max(sender, receiver);
    const int64_t n = getSize();
    const int64_t pair = low * n - low * (low + 1) / 2 + (high - low - 1);  // 0 .. n(n-1)/2 - 1
    const int64_t ways = static_cast<int64_t>(p2p_.size()) / 2;
    return p2p_[static_cast<size_t>(2 * (pair % ways) + (sender > receiver ? 1 : 0))];
  }

  int checkPeer(int64_t peer, const char* what) {
    if (peer < 0 || peer >= getSize())
      fail(std::string(what) + ": rank " + std::to_string(peer) + " is not a rank of a group of " +
           std::to_string(getSize()));
    return static_cast<int>(peer);
  }

  int checkRoot(int64_t root, const char* what) {
    if (root < 0 || root >= getSize())
      fail(std::string(what) + ": root " + std::to_string(root) + " is not a rank of a group of " +
           std::to_string(getSize()));
    return static_cast<int>(root);
  }

  void checkSameType(const at::Tensor& a, const at::Tensor& b, const char* what) {
    if (a.scalar_type() != b.scalar_type())
      fail(std::string(what) + ": the tensors have different dtypes (" +
           c10::toString(a.scalar_type()) + " and " + c10::toString(b.scalar_type()) + ")");
  }

  // A list of world-size tensors, each like `like` in dtype and size.
  void checkParts(const std::vector<at::Tensor>& parts, const at::Tensor& like, const char* what) {
    if (static_cast<int>(parts.size()) != getSize())
      fail(std::string(what) + " has " + std::to_string(parts.size()) +
           " tensors, not the world size " + std::to_string(getSize()));
    for (const auto& p : parts) {
      checkCpu(p, what);
      checkSameType(p, like, what);
      if (p.numel() != like.numel())
        fail(std::string(what) + ": a tensor of " + std::to_string(p.numel()) + " elements where " +
             std::to_string(like.numel()) + " were expected");
    }
  }

  // Copies row r of `gathered` into parts[r].
  static std::function<void()> scatterInto(std::vector<at::Tensor> parts, at::Tensor gathered) {
    return [parts = std::move(parts), gathered]() mutable {
      for (size_t r = 0; r < parts.size(); ++r) parts[r].copy_(gathered[r].view(parts[r].sizes()));
    };
  }

  // parts stacked into one contiguous [world size, numel] tensor that
  // `work` fills when its calls run (a call queued before may write a part).
  at::Tensor gatherFrom(BraidWork& work, const std::vector<at::Tensor>& parts,
                        const at::Tensor& like) {
    at::Tensor stacked = at::empty({getSize(), like.numel()}, like.options());
    work.hold(stacked);
    for (const at::Tensor& part : parts) work.hold(part);
    work.beforeCalls([stacked, parts]() mutable {
      for (size_t r = 0; r < parts.size(); ++r) stacked[r].copy_(parts[r].reshape({-1}));
    });
    return stacked;
  }

  // Byte offsets and sizes of the per-rank row blocks of t.
  void rowParts(const at::Tensor& t, const std::vector<int64_t>& splits, const char* what,
                std::vector<size_t>* offsets, std::vector<size_t>* bytes) {
    const int n = getSize();
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    size_t rowBytes = rows == 0 ? 0 : bytesOf(t) / rows;
    std::vector<int64_t> counts = splits;
    if (counts.empty()) {
      if (rows % n != 0)
        fail(std::string("alltoall_base: the ") + what + " has " + std::to_string(rows) +
             " rows, not divisible by the world size " + std::to_string(n));
      counts.assign(n, rows / n);
    }
    if (static_cast<int>(counts.size()) != n)
      fail(std::string("alltoall_base: ") + what + " splits have " + std::to_string(counts.size()) +
           " entries, not the world size " + std::to_string(n));
    int64_t total = 0;
    for (int64_t c : counts) {
      if (c < 0) fail(std::string("alltoall_base: a negative ") + what + " split");
      offsets->push_back(static_cast<size_t>(total) * rowBytes);
      bytes->push_back(static_cast<size_t>(c) * rowBytes);
      total += c;
    }
    if (total != rows)
      fail(std::string("alltoall_base: ") + what + " splits add up to " + std::to_string(total) +
           " rows, but the " + what + " has " + std::to_string(rows));
  }

  void teardown() {
    // Calls still queued when the group goes (an irecv nobody matches)
    // would hold the destroy up to BRAID_TIMEOUT: as NCCL's destructor
    // aborts its communicators, they fail at once instead. Pending means a
    // work not finished: right after a wait() the finished work's future
    // may still run callbacks, and an abort then would fail the peers'
    // last call.
    if (*unfinished_ > 0 && comm_) braidCommAbort(comm_);
    // Destroying a stream waits for its calls and callbacks.
    bool streamsGone = !collectives_ || braidStreamDestroy(collectives_) == braidSuccess;
    for (braidStream_t stream : p2p_)
      streamsGone = (!stream || braidStreamDestroy(stream) == braidSuccess) && streamsGone;
    if (comm_) braidCommDestroy(comm_);
    collectives_ = nullptr;
    p2p_.clear();
    comm_ = nullptr;
    // Last: the streams' callbacks, run by now, posted their completions.
    // A stream that could not be destroyed (from its own thread) may still
    // post: its completion thread is left to it.
    if (streamsGone)
      completions_.reset();
    else
      (void)completions_.release();
  }

  braidComm_t comm_ = nullptr;
  std::shared_ptr<std::atomic<int>> unfinished_ = std::make_shared<std::atomic<int>>(0);
  braidStream_t collectives_ = nullptr;
  std::vector<braidStream_t> p2p_;  // pointToPointStream
  std::unique_ptr<CompletionThread> completions_ = std::make_unique<CompletionThread>();
  bool coalescing_ = false;
  std::vector<std::pair<braidStream_t, c10::intrusive_ptr<BraidWork>>> coalesced_;
};

c10::intrusive_ptr<c10d::ProcessGroup> createProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::duration<float> timeout) {
  return c10::make_intrusive<ProcessGroupBraid>(store, rank, size, timeout);
}

}  // namespace
}  // namespace braid_torch

PYBIND11_MODULE(braid_torch, m) {
  m.doc() =
      "braid as a torch.distributed backend: importing this module registers the backend "
      "\"braid\" for torch.distributed.init_process_group.";
  py::module_ dist = py::module_::import("torch.distributed");
  m.def("create_process_group", &braid_torch::createProcessGroup, py::arg("store"), py::arg("rank"),
        py::arg("world_size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
        "Creates a braid ProcessGroup over the ranks that share `store` (the creator function "
        "registered for the backend \"braid\").");
  int version = 0;
  braidGetVersion(&version);
  m.attr("braid_version") = version;
  m.attr("backend_name") = braid_torch::kBackendName;
  dist.attr("Backend").attr("register_backend")(braid_torch::kBackendName,
                                                m.attr("create_process_group"));
}
