// The sweep, the timing, the table: everything of a perf test but the
// collective itself (see perf_driver.h).
#include "perf_driver.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_buffers.h"
#include "perf_options.h"
#include "perf_registration.h"
#include "src/common/byte_size.h"

namespace braid::perf {
namespace {

using Json = nlohmann::ordered_json;

// Formats like nccl-tests: as many decimals as `width` allows.
std::string fitNumber(double value, int width) {
  int digits = 0;
  for (double power = 1; value >= power && digits < 40; power *= 10) ++digits;
  char text[64];
  if (digits < width - 2)
    std::snprintf(text, sizeof(text), "%*.2f", width, value);
  else if (digits < width - 1)
    std::snprintf(text, sizeof(text), "%*.1f", width, value);
  else if (digits < width + 1)
    std::snprintf(text, sizeof(text), "%*.0f", width, value);
  else
    std::snprintf(text, sizeof(text), "%*.1e", width, value);
  return text;
}

// Page-aligned and never smaller than a page, so that count == 0 has a
// buffer. `shared` (-R): from braidHostAlloc, as nccl-tests' -R takes its
// buffers from ncclMemAlloc, so that ranks of a host read them in place.
using Buffer = std::unique_ptr<std::byte, void (*)(void*)>;
Buffer allocateBuffer(size_t bytes, bool shared) {
  constexpr size_t kAlign = 4096;
  size_t rounded = std::max(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (shared) {
    void* memory = nullptr;
    if (braidHostAlloc(&memory, rounded) != braidSuccess) throw std::bad_alloc();
    return Buffer(static_cast<std::byte*>(memory), [](void* p) { (void)braidHostFree(p); });
  }
  auto* memory = static_cast<std::byte*>(std::aligned_alloc(kAlign, rounded));
  if (memory == nullptr) throw std::bad_alloc();
  return Buffer(memory, &std::free);
}

struct Measurement {
  bool measured = false;  // false: braid has no such call (the in-place half of some tests)
  double timeUs = 0;
  double algBw = 0, busBw = 0;  // GB/s
  int64_t wrong = 0;
  // What braid chose for the timed calls; "-" where nothing was called (count
  // 0) or braid names no algorithm (Send/Recv).
  const char* algorithm = "-";
};

std::string utcNow() {
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

// One process's run of the sweep. A failed braid call ends the process (after
// aborting the communicator, so that the peers fail fast instead of waiting).
class PerfRun {
 public:
  PerfRun(const Collective& collective, const Options& options, braidComm_t comm)
      : collective_(collective), options_(options), comm_(comm) {
    expectOk(braidCommUserRank(comm_, &rank_), "braidCommUserRank");
    expectOk(braidCommCount(comm_, &nranks_), "braidCommCount");
    if (collective_.usesRoot && !options_.allRoots &&
        (options_.root < 0 || options_.root >= nranks_)) {
      throw std::invalid_argument("root " + std::to_string(options_.root) + " is not a rank");
    }
    if (options_.blocking == 0) expectOk(braidStreamCreate(comm_, &stream_), "braidStreamCreate");
    if (options_.cudaMemory) cuda_.emplace(rank_);
  }

  ~PerfRun() { (void)braidStreamDestroy(stream_); }

  int run() {
    printPreamble();
    std::vector<int> roots = {-1};
    if (collective_.usesRoot) {
      roots = {options_.root};
      if (options_.allRoots) {
        roots.clear();
        for (int r = 0; r < nranks_; ++r) roots.push_back(r);
      }
    }
    // With --mem cuda, GPU buffers the shape of the host ones below, for
    // every type at once: allocated once for the whole run, since peers
    // that read cudaMalloc buffers in place keep them open
    // (BRAID_CUDA_IPC_DIRECT_BYTES); with -R 1, from braidMemAlloc.
    std::optional<CudaDriver::Buffer> deviceSend, deviceRecv;
    if (cuda_) {
      size_t sendBytes = 0, recvBytes = 0;
      for (const DataType* type : options_.types) {
        Sizes largest = collective_.sizesFor(options_.sweep.back(), type->size, nranks_);
        sendBytes = std::max(sendBytes, largest.sendCount * type->size);
        recvBytes =
            std::max(recvBytes, std::max(largest.sendCount, largest.recvCount) * type->size);
      }
      deviceSend.emplace(cuda_->allocate(sendBytes, options_.localRegister));
      deviceRecv.emplace(cuda_->allocate(recvBytes, options_.localRegister));
    }
    for (const DataType* type : options_.types) {
      // Allocated once, for the largest size; the receive buffer also holds
      // the in-place send data.
      Sizes largest = collective_.sizesFor(options_.sweep.back(), type->size, nranks_);
      Buffer send = allocateBuffer(largest.sendCount * type->size, options_.localRegister);
      const size_t recvBytes = std::max(largest.sendCount, largest.recvCount) * type->size;
      Buffer recv = allocateBuffer(recvBytes, options_.localRegister);
      // The calls use the GPU buffers, and the host ones stage the inputs
      // and the results to check.
      GpuMirror mirror;
      if (cuda_) mirror = {deviceSend->get(), deviceRecv->get()};
      Registration sendDeclared, recvDeclared;
      if (options_.localRegister) {
        sendDeclared =
            Registration(comm_, cuda_ ? mirror.send : send.get(), largest.sendCount * type->size);
        recvDeclared = Registration(comm_, cuda_ ? mirror.recv : recv.get(), recvBytes);
      }
      for (const RedOp& op : options_.ops) {
        for (int root : roots) {
          for (size_t bytes : options_.sweep) {
            TestContext ctx{.comm = comm_,
                            .rank = rank_,
                            .nranks = nranks_,
                            .type = type,
                            .op = op.op,
                            .root = root,
                            .sizes = collective_.sizesFor(bytes, type->size, nranks_),
                            .inPlace = false,
                            .stream = stream_};
            Measurement outOfPlace = measure(ctx, send, recv, mirror);
            ctx.inPlace = true;
            Measurement inPlace =
                collective_.hasInPlace ? measure(ctx, send, recv, mirror) : Measurement{};
            printRow(ctx, op, outOfPlace, inPlace);
          }
        }
      }
    }
    const double avgBusBw = busBwCount_ ? busBwSum_ / busBwCount_ : 0;
    if (rank_ == 0) {
      std::printf("# %-20s : %d %s\n", "Out of bounds values", failedMeasurements_,
                  failedMeasurements_ ? "FAILED" : "OK");
      std::printf("# %-20s : %g \n", "Avg bus bandwidth", avgBusBw);
      std::printf("#\n# Collective test concluded: %s\n#\n", collective_.name);
      std::fflush(stdout);
    }
    int exitCode = failedMeasurements_ ? 1 : 0;
    if (rank_ == 0 && !options_.jsonPath.empty() && !writeJson(avgBusBw)) exitCode = 1;
    // A launcher may stop every rank once one exits with an error: none
    // exits before rank 0 has written everything.
    expectOk(braidBarrier(comm_, nullptr), "braidBarrier (end)");
    return exitCode;
  }

 private:
  void expectOk(braidResult_t result, const std::string& what) {
    if (result == braidSuccess) return;
    failRun(comm_, result,
            std::string(collective_.name) + ": rank " + std::to_string(rank_) + ": " + what);
  }

  struct RankInfo {
    int32_t pid;
    int32_t gpu;  // the GPU's ordinal with --mem cuda, else -1
    char host[120];
  };

  void printPreamble() {
    // Each rank fills its slot; a max-reduction of the zeroed rest gathers them.
    rankInfos_.assign(static_cast<size_t>(nranks_), RankInfo{});
    RankInfo& mine = rankInfos_[static_cast<size_t>(rank_)];
    mine.pid = static_cast<int32_t>(::getpid());
    mine.gpu = cuda_ ? cuda_->ordinal() : -1;
    ::gethostname(mine.host, sizeof(mine.host) - 1);
    expectOk(
        braidAllReduce(rankInfos_.data(), rankInfos_.data(), rankInfos_.size() * sizeof(RankInfo),
                       braidUint8, braidMax, comm_, nullptr),
        "braidAllReduce (rank information)");
    if (rank_ != 0) return;
    int version = 0;
    (void)braidGetVersion(&version);
    std::printf("# braid-tests: %s (braid %d.%d.%d)\n", collective_.name, version / 10000,
                version / 100 % 100, version % 100);
    std::printf(
        "# nranks %d minBytes %zu maxBytes %zu step: %s warmup iters: %d iters: %d "
        "agg iters: %d validation: %d average: %d blocking: %d mem: %s\n",
        nranks_, options_.minBytes, options_.maxBytes, options_.stepText.c_str(),
        options_.warmupIters, options_.iters, options_.aggIters, options_.checkIters,
        options_.average, options_.blocking, options_.cudaMemory ? "cuda" : "host");
    std::printf("#\n# Using ranks\n");
    for (int r = 0; r < nranks_; ++r) {
      const RankInfo& info = rankInfos_[static_cast<size_t>(r)];
      if (info.gpu >= 0)
        std::printf("#  Rank %2d Pid %6d on %10s GPU %d\n", r, info.pid, info.host, info.gpu);
      else
        std::printf("#  Rank %2d Pid %6d on %10s\n", r, info.pid, info.host);
    }
    const char* row = "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s%s\n";
    std::printf(
        "#\n# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place\n",
        "", "", "", "", "");
    std::printf(row, "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                "time", "algbw", "busbw", "#wrong", options_.showAlgorithm ? "  algorithm" : "");
    std::printf(row, "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
                "(GB/s)", "(GB/s)", "", "");
    std::fflush(stdout);
  }

  // Queues (or, blocking, runs) one iteration: -m calls, in one group when
  // more than one; complete() waits for what is queued.
  void issue(const TestContext& ctx, const void* send, void* recv, const std::string& what) {
    if (options_.aggIters == 1) {
      expectOk(collective_.run(ctx, send, recv), what);
      return;
    }
    expectOk(braidGroupStart(), what);
    for (int i = 0; i < options_.aggIters; ++i) expectOk(collective_.run(ctx, send, recv), what);
    expectOk(braidGroupEnd(), what);
  }
  void complete(const std::string& what) {
    if (stream_ != nullptr) expectOk(braidStreamSynchronize(stream_), what);
  }

  bool holdsResult(const TestContext& ctx) const {
    return !collective_.resultAtRootOnly || ctx.rank == ctx.root;
  }

  // GPU buffers shaped like the host ones (--mem cuda), or none.
  struct GpuMirror {
    std::byte* send = nullptr;
    std::byte* recv = nullptr;
  };

  Measurement measure(const TestContext& ctx, Buffer& send, Buffer& recv, const GpuMirror& gpu) {
    const size_t eltSize = ctx.type->size;
    const size_t rank = static_cast<size_t>(rank_);
    std::byte* sendPtr =
        ctx.inPlace ? recv.get() + ctx.sizes.sendInPlaceOffset * rank * eltSize : send.get();
    std::byte* recvPtr =
        recv.get() + (ctx.inPlace ? ctx.sizes.recvInPlaceOffset * rank * eltSize : 0);
    const size_t sendBytes = ctx.sizes.sendCount * eltSize;
    const size_t recvBytes = std::max(ctx.sizes.sendCount, ctx.sizes.recvCount) * eltSize;
    // The calls' buffers: the host ones, or the same offsets in GPU memory,
    // where the inputs are copied before the calls and the results back after.
    std::byte* callSend = sendPtr;
    std::byte* callRecv = recvPtr;
    if (cuda_) {
      callSend = ctx.inPlace ? gpu.recv + (sendPtr - recv.get()) : gpu.send;
      callRecv = gpu.recv + (recvPtr - recv.get());
    }
    auto upload = [&] {
      if (!cuda_) return;
      if (!ctx.inPlace) cuda_->toDevice(callSend, sendPtr, sendBytes);
      cuda_->toDevice(gpu.recv, recv.get(), recvBytes);  // in place, the inputs are in it
    };
    const std::string what = std::string(ctx.inPlace ? "in-place" : "out-of-place") + " run at " +
                             std::to_string(ctx.sizes.bytes) + " B";

    collective_.initData(ctx, sendPtr);
    upload();
    for (int i = 0; i < options_.warmupIters; ++i) {
      issue(ctx, callSend, callRecv, what);
      complete(what);
    }
    expectOk(braidBarrier(comm_, nullptr), "braidBarrier");
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < options_.iters; ++i) issue(ctx, callSend, callRecv, what);
    complete(what);
    std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;

    Measurement result;
    result.measured = true;
    result.timeUs = elapsed.count() / (static_cast<double>(options_.iters) * options_.aggIters);
    // Asked before the driver's own AllReduce below replaces the answer.
    if (collective_.braidName != nullptr && ctx.sizes.count > 0) {
      const char* algorithm = nullptr;
      if (braidCommGetLastAlgorithm(comm_, collective_.braidName, &algorithm) == braidSuccess &&
          algorithm != nullptr && algorithm[0] != '\0')
        result.algorithm = algorithm;
    }
    static constexpr braidRedOp_t kTimeReduction[] = {braidSum, braidSum, braidMin, braidMax};
    if (options_.average != 0) {
      expectOk(braidAllReduce(&result.timeUs, &result.timeUs, 1, braidFloat64,
                              kTimeReduction[options_.average], comm_, nullptr),
               "braidAllReduce (time)");
      if (options_.average == 1) result.timeUs /= nranks_;
    }
    result.algBw =
        result.timeUs > 0 ? static_cast<double>(ctx.sizes.algBytes) / result.timeUs / 1e3 : 0;
    result.busBw = result.algBw * collective_.busBwFactor(nranks_);

    // Checked on fresh inputs, into a poisoned receive buffer, so that
    // neither the timed runs' results nor stale data can pass for correct.
    const bool corrupt =
        rank_ == options_.corruptRank && holdsResult(ctx) && ctx.sizes.recvCount > 0;
    for (int i = 0; i < options_.checkIters; ++i) {
      std::memset(recv.get(), 0xa5, recvBytes);
      collective_.initData(ctx, sendPtr);
      upload();
      // One call, whatever -m says: a group of calls in place would apply
      // the collective to its own result.
      expectOk(collective_.run(ctx, callSend, callRecv), what);
      complete(what);
      if (cuda_) cuda_->toHost(recv.get(), gpu.recv, recvBytes);
      // Bit 6 of the first byte: more than the 2 ULPs an average may be off,
      // in every datatype.
      if (corrupt) recvPtr[0] ^= std::byte{0x40};
      // As nccl-tests: #wrong is the first checked iteration's with wrong
      // elements, summed over the ranks, not a sum over the iterations.
      int64_t wrong = collective_.check(ctx, recvPtr);
      expectOk(braidAllReduce(&wrong, &wrong, 1, braidInt64, braidSum, comm_, nullptr),
               "braidAllReduce (#wrong)");
      result.wrong = wrong;
      if (wrong != 0) break;
    }
    return result;
  }

  // Whole lines only, so that a failure never leaves half a row behind.
  void printRow(const TestContext& ctx, const RedOp& op, const Measurement& outOfPlace,
                const Measurement& inPlace) {
    const char* opName = collective_.usesOp ? op.name : "none";
    char row[320];
    int length = std::snprintf(row, sizeof(row), "%12zu  %12zu  %8s  %6s  %6d", ctx.sizes.bytes,
                               ctx.sizes.count, ctx.type->name, opName, ctx.root);
    for (const Measurement* m : {&outOfPlace, &inPlace}) {
      if (m->measured) {
        busBwSum_ += m->busBw;
        ++busBwCount_;
        failedMeasurements_ += m->wrong > 0 ? 1 : 0;
      }
      std::string wrong = m->measured && options_.checkIters > 0 ? std::to_string(m->wrong) : "N/A";
      length += std::snprintf(row + length, sizeof(row) - static_cast<size_t>(length),
                              "  %7s  %6s  %6s  %6s",
                              m->measured ? fitNumber(m->timeUs, 7).c_str() : "N/A",
                              m->measured ? fitNumber(m->algBw, 6).c_str() : "N/A",
                              m->measured ? fitNumber(m->busBw, 6).c_str() : "N/A", wrong.c_str());
    }
    if (rank_ != 0) return;
    if (options_.showAlgorithm)
      length += std::snprintf(row + length, sizeof(row) - static_cast<size_t>(length), "  %s",
                              outOfPlace.algorithm);
    std::printf("%s\n", row);
    std::fflush(stdout);
    jsonRows_.push_back(Json{{"size", ctx.sizes.bytes},
                             {"count", ctx.sizes.count},
                             {"type", ctx.type->name},
                             {"redop", opName},
                             {"root", ctx.root},
                             {"algorithm", knownAlgorithm(outOfPlace)},
                             {"out_of_place", toJson(outOfPlace)},
                             {"in_place", toJson(inPlace)}});
  }

  static Json knownAlgorithm(const Measurement& m) {
    if (!m.measured || std::strcmp(m.algorithm, "-") == 0) return nullptr;
    return m.algorithm;
  }

  // Unmeasured or unchecked values are null, as the table's N/A.
  Json toJson(const Measurement& m) const {
    if (!m.measured)
      return Json{{"time_us", nullptr},
                  {"algbw_gbps", nullptr},
                  {"busbw_gbps", nullptr},
                  {"wrong", nullptr},
                  {"algorithm", nullptr}};
    return Json{{"time_us", m.timeUs},
                {"algbw_gbps", m.algBw},
                {"busbw_gbps", m.busBw},
                {"wrong", options_.checkIters > 0 ? Json(m.wrong) : Json(nullptr)},
                {"algorithm", knownAlgorithm(m)}};
  }

  bool writeJson(double avgBusBw) const {
    int version = 0;
    (void)braidGetVersion(&version);
    Json ranks = Json::array();
    for (int r = 0; r < nranks_; ++r) {
      const RankInfo& info = rankInfos_[static_cast<size_t>(r)];
      ranks.push_back(Json{{"rank", r},
                           {"pid", info.pid},
                           {"hostname", info.host},
                           {"gpu", info.gpu >= 0 ? Json(info.gpu) : Json(nullptr)}});
    }
    Json document{
        {"benchmark", collective_.name},
        {"braid_version", std::to_string(version / 10000) + "." +
                              std::to_string(version / 100 % 100) + "." +
                              std::to_string(version % 100)},
        {"date", utcNow()},
        {"command", options_.commandLine},
        {"parameters",
         {{"minbytes", options_.minBytes},
          {"maxbytes", options_.maxBytes},
          {"stepbytes", options_.stepFactor > 1 ? Json(nullptr) : Json(options_.stepBytes)},
          {"stepfactor", options_.stepFactor > 1 ? Json(options_.stepFactor) : Json(nullptr)},
          {"iters", options_.iters},
          {"warmup_iters", options_.warmupIters},
          {"agg_iters", options_.aggIters},
          {"check", options_.checkIters},
          {"datatype", options_.typeArg},
          {"op", collective_.usesOp ? Json(options_.opArg) : Json(nullptr)},
          {"root", collective_.usesRoot ? Json(options_.rootArg) : Json(nullptr)},
          {"average", kTimeReported[options_.average]},
          {"blocking", options_.blocking},
          {"mem", options_.cudaMemory ? "cuda" : "host"},
          {"busbw_factor", collective_.busBwFactor(nranks_)}}},
        {"machine",
         {{"hostname", rankInfos_[0].host}, {"nranks", nranks_}, {"ranks", std::move(ranks)}}},
        {"rows", jsonRows_},
        {"out_of_bounds", failedMeasurements_},
        {"avg_busbw_gbps", avgBusBw},
        {"ok", failedMeasurements_ == 0}};
    std::ofstream out(options_.jsonPath);
    out << document.dump(2) << '\n';
    out.close();
    if (!out) {
      std::fprintf(stderr, "%s: cannot write %s\n", collective_.name, options_.jsonPath.c_str());
      return false;
    }
    return true;
  }

  const Collective& collective_;
  const Options& options_;
  braidComm_t comm_;
  braidStream_t stream_ = nullptr;
  int rank_ = 0;
  int nranks_ = 1;
  std::vector<RankInfo> rankInfos_;
  std::optional<CudaDriver> cuda_;  // --mem cuda
  int failedMeasurements_ = 0;      // (size, placement) pairs with #wrong > 0
  double busBwSum_ = 0;
  int busBwCount_ = 0;
  Json jsonRows_ = Json::array();
};

}  // namespace

// "32M" -> 33554432 (src/common/byte_size.h).
size_t parseBytes(const std::string& text) {
  if (std::optional<size_t> bytes = parseByteSize(text)) return *bytes;
  // As nccl-tests reads a size (sscanf's "%lf %c"): a number with a fraction
  // ("0.5M"), or the suffix after a space ("32 M"), rounded down to bytes.
  const std::string bad = "bad size '" + text + "'";
  size_t at = 0;
  while (at < text.size() && ((text[at] >= '0' && text[at] <= '9') || text[at] == '.')) ++at;
  const std::string number = text.substr(0, at);
  if (number.empty() || number == "." || number.find('.') != number.rfind('.'))
    throw std::invalid_argument(bad);
  while (at < text.size() && text[at] == ' ') ++at;
  double scale = 1;
  if (at < text.size()) {
    const char suffix = static_cast<char>(std::toupper(static_cast<unsigned char>(text[at])));
    scale = suffix == 'K' ? 0x1p10 : suffix == 'M' ? 0x1p20 : suffix == 'G' ? 0x1p30 : 0;
    if (scale == 0 || at + 1 != text.size()) throw std::invalid_argument(bad);
  }
  const double bytes = std::strtod(number.c_str(), nullptr) * scale;
  if (!(bytes < 0x1p63)) throw std::invalid_argument(bad);
  return static_cast<size_t>(bytes);
}

int perfMain(int argc, char** argv, const Collective& collective) {
  Options options;
  try {
    options = parseOptions(argc, argv, collective);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s (see --help)\n", collective.name, error.what());
    return 2;
  }
  braidComm_t comm = nullptr;
  if (braidResult_t result = braidCommInitFromEnv(&comm); result != braidSuccess) {
    std::fprintf(stderr, "%s: braidCommInitFromEnv failed: %s: %s\n", collective.name,
                 braidGetErrorString(result), braidGetLastError(nullptr));
    return 1;
  }
  int exitCode = 1;
  try {
    exitCode = PerfRun(collective, options, comm).run();
  } catch (const std::exception& error) {  // a bad root, an allocation that failed
    std::fprintf(stderr, "%s: %s\n", collective.name, error.what());
    (void)braidCommAbort(comm);
  }
  if (braidResult_t result = braidCommDestroy(comm); result != braidSuccess) {
    std::fprintf(stderr, "%s: braidCommDestroy failed: %s: %s\n", collective.name,
                 braidGetErrorString(result), braidGetLastError(nullptr));
    exitCode = 1;
  }
  return exitCode;
}

}  // namespace braid::perf
