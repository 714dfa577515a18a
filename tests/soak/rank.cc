// A soak rank: runs the coordinator's calls and checks every result, input and output edge.
#include <dirent.h>
#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "braid.h"
#include "soak.h"
#include "values.h"

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

namespace soak {
namespace {

int64_t countEntries(const char* dir) {
  DIR* d = ::opendir(dir);
  if (!d) return -1;
  int64_t n = 0;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

int64_t statusKiB(const char* field) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t v = -1;
  const size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0 && line[n] == ':') v = std::atoll(line + n + 1);
  std::fclose(f);
  return v;
}

// ---------------------------------------------------------------------------
// A rank.

class Rank {
  // What one call in flight needs; two on two streams.
  struct Slot {
    std::vector<uint8_t> send, recv, expected;
    size_t sendElements = 0;  // of send, filled by prepare() and never to change
    braidStream_t stream = nullptr;
  };

 public:
  Rank(const Options& o, int rank, int commandFd, int reportFd, Progress* progress)
      : o_(o), rank_(rank), in_(commandFd), out_(reportFd), progress_(progress) {
    const size_t bytes = o.maxBytes + 64;
    for (Slot& slot : slots_) {
      slot.send.assign(bytes, 0);
      slot.recv.assign(bytes, 0);
      slot.expected.assign(bytes, 0);
    }
  }

  int run() {
    CommandMessage m;
    while (readAll(in_, &m, sizeof m)) {
      switch (m.command) {
        case Command::kEpoch:
          startEpoch(m);
          break;
        case Command::kBatch:
          runBatch(m.first, m.end);
          break;
        case Command::kEndEpoch:
          endEpoch();
          break;
        case Command::kDone: {
#ifdef __SANITIZE_ADDRESS__
          // Ranks end with _Exit, past LeakSanitizer's exit hook: every
          // communicator is gone by now, so anything still allocated by
          // braid is a leak.
          if (__lsan_do_recoverable_leak_check() != 0) ++stats_.badFailures;
#endif
          Report r = report(ReportKind::kStats);
          writeAll(out_, &r, sizeof r);
          writeAll(out_, &stats_, sizeof stats_);
          return 0;
        }
        case Command::kId:
          break;
      }
    }
    return 1;  // the coordinator went away
  }

 private:
  Report report(ReportKind kind) {
    Report r{};
    r.kind = kind;
    r.rank = rank_;
    r.failedAt = -1;
    return r;
  }

  void startEpoch(const CommandMessage& m) {
    progress_->epoch = m.epoch;
    std::string summary;
    for (const auto& [k, v] : epochEnvironment(o_, m.epoch, rank_, &summary)) setVariable(k, v);
    useStream_ = epochUsesStream(o_, m.epoch);
    braidUniqueId id{};
    if (rank_ == 0) {
      Report r = report(ReportKind::kId);
      r.code = braidGetUniqueId(&id);
      std::snprintf(r.message, sizeof r.message, "%s", braidGetLastError(nullptr));
      std::memcpy(r.id, id.internal, sizeof r.id);
      // On failure the zero id fails init at once, on every rank.
      writeAll(out_, &r, sizeof r);
    } else {
      CommandMessage idMessage;
      if (!readAll(in_, &idMessage, sizeof idMessage)) std::_Exit(1);
      std::memcpy(id.internal, idMessage.id, sizeof id.internal);
    }
    const auto start = Clock::now();
    Report r = report(ReportKind::kInit);
    r.code = braidCommInitRank(&comm_, o_.ranks, id, rank_);
    if (r.code == braidSuccess) r.code = braidCommSetTimeout(comm_, o_.timeout);
    // Two streams: consecutive calls run on them at once, sharing every
    // connection.
    for (Slot& slot : slots_)
      if (r.code == braidSuccess && useStream_) r.code = braidStreamCreate(comm_, &slot.stream);
    std::snprintf(r.message, sizeof r.message, "%s", braidGetLastError(nullptr));
    stats_.initSeconds += secondsSince(start);
    writeAll(out_, &r, sizeof r);
  }

  void destroyCommunicator() {
    for (Slot& slot : slots_) {
      if (slot.stream) braidStreamDestroy(slot.stream);
      slot.stream = nullptr;
    }
    if (comm_) braidCommDestroy(comm_);
    comm_ = nullptr;
  }

  void endEpoch() {
    const auto start = Clock::now();
    destroyCommunicator();
    stats_.destroySeconds += secondsSince(start);
    Report r = report(ReportKind::kEpochDone);
    // Free memory the allocator keeps is not held by anyone: hand it back
    // first, so that what remains is what is in use.
    ::malloc_trim(0);
    r.fds = countEntries("/proc/self/fd");
    r.threads = countEntries("/proc/self/task");
    r.rssKiB = statusKiB("VmRSS");
    r.anonKiB = statusKiB("RssAnon");
    const struct mallinfo2 heap = ::mallinfo2();
    r.heapBytes = static_cast<int64_t>(heap.uordblks + heap.hblkhd);
    writeAll(out_, &r, sizeof r);
  }

  void runBatch(int64_t first, int64_t end) {
    Report r = report(ReportKind::kBatch);
    // On streams two calls at a time, one per stream; else one.
    const int64_t step = slots_[0].stream ? 2 : 1;
    for (int64_t i = first; i < end && comm_; i += step) {
      const int n = static_cast<int>(std::min(step, end - i));
      Call calls[2];
      braidResult_t results[2] = {braidSuccess, braidSuccess};
      std::string whys[2];
      progress_->call = i;
      const auto start = Clock::now();
      for (int k = 0; k < n; ++k) {
        calls[k] = makeCall(o_, i + k);
        const Call& c = calls[k];
        std::snprintf(progress_->what, sizeof progress_->what, "%s count %zu type %d op %d root %d",
                      kKindNames[static_cast<int>(c.kind)], c.count, c.dtype, c.op, c.root);
        prepare(c, slots_[k]);
        results[k] = issue(c, slots_[k]);
        if (results[k] != braidSuccess) whys[k] = braidGetLastError(nullptr);
      }
      for (int k = 0; k < n; ++k)
        if (results[k] == braidSuccess && slots_[k].stream) {
          results[k] = braidStreamSynchronize(slots_[k].stream);
          if (results[k] != braidSuccess) whys[k] = braidGetLastError(nullptr);
        }
      const double seconds = secondsSince(start);
      int64_t failedAt = -1;
      for (int k = 0; k < n; ++k) {
        const Call& c = calls[k];
        ++stats_.calls;
        ++stats_.callsByKind[static_cast<int>(c.kind)];
        if (results[k] == braidSuccess) {
          ++stats_.successes;
          stats_.callSeconds += seconds / n;
          const auto checkStart = Clock::now();
          check(c, slots_[k]);
          stats_.checkSeconds += secondsSince(checkStart);
          continue;
        }
        noteFailure(c, results[k], whys[k], seconds);
        if (failedAt < 0) {
          failedAt = i + k;
          r.code = results[k];
          r.failedAt = failedAt;
          r.seconds = seconds;
          std::snprintf(r.message, sizeof r.message, "%s", whys[k].c_str());
        }
      }
      if (failedAt < 0) continue;
      // A failed call leaves the communicator unusable on this rank: the
      // next call fails too, at once, instead of waiting for peers that
      // gave up or returning what they did not send.
      const auto againStart = Clock::now();
      const braidResult_t again = braidBarrier(comm_, nullptr);
      const double againSeconds = secondsSince(againStart);
      if (again == braidSuccess || againSeconds > 2) {
        if (stats_.badFailures++ == 0)
          std::snprintf(stats_.firstBad, sizeof stats_.firstBad,
                        "after call #%lld failed (%d: %.300s), the next call on the communicator "
                        "returned %d after %.2f s",
                        static_cast<long long>(failedAt), r.code, r.message, again, againSeconds);
      }
      // The communicator is done for; the coordinator decides when every
      // rank builds the next.
      destroyCommunicator();
      stats_.skipped += end - i - n;
      break;
    }
    writeAll(out_, &r, sizeof r);
  }

  void noteFailure(const Call& c, braidResult_t result, const std::string& why, double seconds) {
    ++stats_.failuresByCode[result & 15];
    stats_.failedSeconds += seconds;
    stats_.maxFailedCallSeconds = std::max(stats_.maxFailedCallSeconds, seconds);
    // A dropped message looks to its receiver like a peer that moved on
    // (braidInvalidUsage); a cut or a peer that gave up is a remote error;
    // a message that never comes, or comes late, a timeout. Nothing else.
    const bool allowed = result == braidRemoteError || result == braidTimeout ||
                         (result == braidInvalidUsage && mayDrop_);
    const bool late = seconds > o_.timeout + 5;
    if ((!allowed || why.empty() || late) && stats_.badFailures++ == 0)
      std::snprintf(stats_.firstBad, sizeof stats_.firstBad,
                    "call #%lld %s failed with %d after %.2f s: %s",
                    static_cast<long long>(c.index), kKindNames[static_cast<int>(c.kind)], result,
                    seconds, why.empty() ? "(no message)" : why.c_str());
  }

  // Fills this rank's inputs and poisons its outputs.
  void prepare(const Call& c, Slot& slot) {
    const size_t es = typeSize(c.dtype), n = static_cast<size_t>(o_.ranks);
    const size_t parts = partsOf(c.kind, o_.ranks);
    std::memset(slot.recv.data(), 0xa5, std::min(slot.recv.size(), c.count * parts * es + 64));
    const Values mine = valuesOf(c, rank_, o_.ranks);
    // Inputs a call must leave as they are (out of place only).
    slot.sendElements = 0;
    if (!c.inPlace && c.kind != Kind::kBarrier)
      slot.sendElements = c.kind == Kind::kReduceScatter || c.kind == Kind::kAllToAll ||
                                  (c.kind == Kind::kScatter && rank_ == c.root)
                              ? n * c.count
                          : c.kind == Kind::kScatter ? 0
                                                     : c.count;
    switch (c.kind) {
      case Kind::kAllGather:
        if (c.inPlace)
          fill(slot.recv.data(), rank_ * c.count, c.count, c.dtype, mine, 0);
        else
          fill(slot.send.data(), 0, c.count, c.dtype, mine, 0);
        break;
      case Kind::kReduceScatter:
        fill(slot.send.data(), 0, n * c.count, c.dtype, mine, 0);
        break;
      case Kind::kGather:
        if (c.inPlace && rank_ == c.root)
          fill(slot.recv.data(), rank_ * c.count, c.count, c.dtype, mine, 0);
        else
          fill(slot.send.data(), 0, c.count, c.dtype, mine, 0);
        break;
      case Kind::kScatter:
        if (rank_ == c.root) fill(slot.send.data(), 0, n * c.count, c.dtype, mine, 0);
        break;
      case Kind::kAllToAll:
        fill(slot.send.data(), 0, n * c.count, c.dtype, mine, 0);
        break;
      case Kind::kBarrier:
        break;
      default:
        if (c.inPlace)
          fill(slot.recv.data(), 0, c.count, c.dtype, mine, 0);
        else
          fill(slot.send.data(), 0, c.count, c.dtype, mine, 0);
    }
  }

  braidResult_t issue(const Call& c, Slot& slot) {
    const size_t es = typeSize(c.dtype);
    uint8_t* send = slot.send.data();
    uint8_t* recv = slot.recv.data();
    const void* in = c.inPlace ? recv : send;
    braidStream_t s = slot.stream;
    braidResult_t r = braidSuccess;
    switch (c.kind) {
      case Kind::kAllReduce:
        r = braidAllReduce(in, recv, c.count, c.dtype, c.op, comm_, s);
        break;
      case Kind::kBroadcast:
        r = braidBroadcast(in, recv, c.count, c.dtype, c.root, comm_, s);
        break;
      case Kind::kReduce:
        r = braidReduce(in, recv, c.count, c.dtype, c.op, c.root, comm_, s);
        break;
      case Kind::kAllGather:
        r = braidAllGather(c.inPlace ? recv + rank_ * c.count * es : send, recv, c.count, c.dtype,
                           comm_, s);
        break;
      case Kind::kReduceScatter:
        r = braidReduceScatter(send, c.inPlace ? send + rank_ * c.count * es : recv, c.count,
                               c.dtype, c.op, comm_, s);
        break;
      case Kind::kAllToAll:
        r = braidAllToAll(send, recv, c.count, c.dtype, comm_, s);
        break;
      case Kind::kGather:
        r = braidGather(c.inPlace && rank_ == c.root ? recv + rank_ * c.count * es : send, recv,
                        c.count, c.dtype, c.root, comm_, s);
        break;
      case Kind::kScatter:
        r = braidScatter(send, c.inPlace && rank_ == c.root ? send + rank_ * c.count * es : recv,
                         c.count, c.dtype, c.root, comm_, s);
        break;
      case Kind::kSendRecv: {
        const int to = (rank_ + c.shift) % o_.ranks;
        const int from = (rank_ - c.shift + o_.ranks) % o_.ranks;
        braidGroupStart();
        braidSend(send, c.count, c.dtype, to, comm_, s);
        braidRecv(recv, c.count, c.dtype, from, comm_, s);
        r = braidGroupEnd();
        break;
      }
      case Kind::kBarrier:
        r = braidBarrier(comm_, s);
        break;
      case Kind::kCount:
        break;
    }
    return r;
  }

  void wrongResult(const Call& c, const char* what, size_t at, size_t bytes, uint8_t got,
                   uint8_t expected) {
    ++stats_.wrong;
    if (stats_.firstWrong[0] == 0)
      std::snprintf(stats_.firstWrong, sizeof stats_.firstWrong,
                    "rank %d: call #%lld %s (count %zu, type %d, op %d, root %d, in place %d, "
                    "epoch %d) returned braidSuccess with %s: byte %zu of %zu is 0x%02x, "
                    "expected 0x%02x",
                    rank_, static_cast<long long>(c.index), kKindNames[static_cast<int>(c.kind)],
                    c.count, c.dtype, c.op, c.root, c.inPlace ? 1 : 0, progress_->epoch.load(),
                    what, at, bytes, got, expected);
  }

  // Compares `bytes` at `got` with slot.expected; false (and a report) if they differ.
  bool same(const Call& c, const char* what, const uint8_t* got, size_t bytes, Slot& slot) {
    if (std::memcmp(got, slot.expected.data(), bytes) == 0) return true;
    size_t at = 0;
    while (at < bytes && got[at] == slot.expected[at]) ++at;
    wrongResult(c, what, at, bytes, got[at], slot.expected[at]);
    return false;
  }

  // Compares this rank's output with what it must be, and its input with
  // what it was.
  void check(const Call& c, Slot& slot) {
    const size_t es = typeSize(c.dtype), n = static_cast<size_t>(o_.ranks);
    if (slot.sendElements > 0) {
      fill(slot.expected.data(), 0, slot.sendElements, c.dtype, valuesOf(c, rank_, o_.ranks), 0);
      if (!same(c, "its send buffer changed", slot.send.data(), slot.sendElements * es, slot))
        return;
    }
    std::vector<Values> all;
    for (int q = 0; q < o_.ranks; ++q) all.push_back(valuesOf(c, q, o_.ranks));
    const uint8_t* got = slot.recv.data();
    size_t elements = 0;
    switch (c.kind) {
      case Kind::kAllReduce:
        storeAll(slot.expected.data(), 0, c.count, c.dtype,
                 [&](size_t i) { return reduceAt(c, all, i); });
        elements = c.count;
        break;
      case Kind::kReduce:
        if (rank_ != c.root) return;
        storeAll(slot.expected.data(), 0, c.count, c.dtype,
                 [&](size_t i) { return reduceAt(c, all, i); });
        elements = c.count;
        break;
      case Kind::kReduceScatter:
        storeAll(slot.expected.data(), 0, c.count, c.dtype,
                 [&](size_t i) { return reduceAt(c, all, rank_ * c.count + i); });
        if (c.inPlace) got = slot.send.data() + rank_ * c.count * es;
        elements = c.count;
        break;
      case Kind::kBroadcast:
        fill(slot.expected.data(), 0, c.count, c.dtype, all[c.root], 0);
        elements = c.count;
        break;
      case Kind::kAllGather:
        for (size_t q = 0; q < n; ++q)
          fill(slot.expected.data(), q * c.count, c.count, c.dtype, all[q], 0);
        elements = n * c.count;
        break;
      case Kind::kGather:
        if (rank_ != c.root) return;
        for (size_t q = 0; q < n; ++q)
          fill(slot.expected.data(), q * c.count, c.count, c.dtype, all[q], 0);
        elements = n * c.count;
        break;
      case Kind::kScatter:
        fill(slot.expected.data(), 0, c.count, c.dtype, all[c.root], rank_ * c.count);
        if (c.inPlace && rank_ == c.root) got = slot.send.data() + rank_ * c.count * es;
        elements = c.count;
        break;
      case Kind::kAllToAll:
        for (size_t q = 0; q < n; ++q)
          fill(slot.expected.data(), q * c.count, c.count, c.dtype, all[q], rank_ * c.count);
        elements = n * c.count;
        break;
      case Kind::kSendRecv:
        fill(slot.expected.data(), 0, c.count, c.dtype,
             all[(rank_ - c.shift + o_.ranks) % o_.ranks], 0);
        elements = c.count;
        break;
      default:
        return;
    }
    const size_t bytes = elements * es;
    stats_.bytesChecked += static_cast<int64_t>(bytes);
    if (!same(c, "a wrong result", got, bytes, slot) || got != slot.recv.data()) return;
    // Nothing written past the result.
    for (size_t at = bytes; at < bytes + 64; ++at)
      if (slot.recv[at] != 0xa5)
        return wrongResult(c, "bytes written past the result", at, bytes, slot.recv[at], 0xa5);
  }

  const Options& o_;
  const int rank_;
  const bool mayDrop_ = faultRate(o_.faults, "drop") > 0;
  const int in_, out_;
  Progress* progress_;
  braidComm_t comm_ = nullptr;
  bool useStream_ = false;
  Slot slots_[2];
  Stats stats_;
};

}  // namespace

int runRank(const Options& o, int rank, int commandFd, int reportFd, Progress* progress) {
  Rank r(o, rank, commandFd, reportFd, progress);
  return r.run();
}

}  // namespace soak
