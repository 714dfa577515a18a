// braidCommInitRankWithStore through a store of files shared by real
// processes, its failures, and stream callbacks (braidStreamAddCallback):
// their order, the status and message they see, and what they must not do.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace braidtest {
namespace {

constexpr std::chrono::seconds kTimeout{120};

// A key-value store of files in one directory: what a shared file system
// gives ranks on many hosts. A value appears whole (written aside, then
// renamed), so a reader never sees half of it.
class FileStore {
 public:
  FileStore() {
    char pattern[] = "/tmp/braid-store-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    if (!made) ADD_FAILURE() << "mkdtemp failed";
    dir_ = made ? made : "/tmp";
  }
  ~FileStore() {
    // The directory holds only files this store wrote.
    std::string command = "rm -rf '" + dir_ + "'";
    if (std::system(command.c_str()) != 0) std::fprintf(stderr, "cannot remove %s\n", dir_.c_str());
  }

  braidStore_t callbacks(const char* prefix) {
    return {this, prefix, &FileStore::set, &FileStore::get};
  }

  std::string pathOf(const std::string& key) const {
    std::string name;
    for (char c : key) name += c == '/' ? '~' : c;
    return dir_ + "/" + name;
  }

  int sets = 0, gets = 0;  // in this process

 private:
  static braidResult_t set(void* context, const char* key, const void* value, size_t bytes) {
    auto* self = static_cast<FileStore*>(context);
    ++self->sets;
    std::string path = self->pathOf(key), aside = path + ".new" + std::to_string(::getpid());
    {
      std::ofstream out(aside, std::ios::binary);
      out.write(static_cast<const char*>(value), static_cast<std::streamsize>(bytes));
      if (!out) return braidSystemError;
    }
    return std::rename(aside.c_str(), path.c_str()) == 0 ? braidSuccess : braidSystemError;
  }

  static braidResult_t get(void* context, const char* key, void* value, size_t capacity,
                           size_t* bytes, double timeoutSeconds) {
    auto* self = static_cast<FileStore*>(context);
    ++self->gets;
    auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds);
    std::string path = self->pathOf(key);
    while (true) {
      std::ifstream in(path, std::ios::binary);
      if (in) {
        std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        *bytes = content.size();
        std::memcpy(value, content.data(), std::min(capacity, content.size()));
        return braidSuccess;
      }
      if (std::chrono::steady_clock::now() > deadline) return braidTimeout;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  std::string dir_;
};

RunOptions storeOptions() {
  RunOptions options;
  options.createId = false;
  options.initComm = false;
  return options;
}

void expectWorks(braidComm_t comm, int rank, int nranks) {
  int count = -1, me = -1;
  RANK_ASSERT_OK(braidCommCount(comm, &count));
  RANK_ASSERT_OK(braidCommUserRank(comm, &me));
  RANK_EXPECT_EQ(count, nranks);
  RANK_EXPECT_EQ(me, rank);
  int64_t mine = rank + 1, sum = 0;
  RANK_ASSERT_OK(braidAllReduce(&mine, &sum, 1, braidInt64, braidSum, comm, nullptr));
  RANK_EXPECT_EQ(sum, int64_t{nranks} * (nranks + 1) / 2);
}

TEST(StoreInit, RanksFindEachOtherThroughTheStore) {
  for (int n : {1, 3}) {
    FileStore store;
    runRanks(
        n,
        [&](RankContext& ctx) {
          braidStore_t s = store.callbacks("job/");
          RANK_ASSERT_OK(braidCommInitRankWithStore(&ctx.comm, ctx.nranks, &s, ctx.rank));
          expectWorks(ctx.comm, ctx.rank, ctx.nranks);
          // Rank 0 only publishes, the others only read: one key in all.
          RANK_EXPECT_EQ(store.sets, ctx.rank == 0 ? 1 : 0);
          RANK_EXPECT_EQ(store.gets, ctx.rank == 0 ? 0 : 1);
        },
        kTimeout, storeOptions());
    EXPECT_EQ(::access(store.pathOf("job/braid/uniqueId").c_str(), F_OK), 0)
        << "the documented key was not used";
  }
}

TEST(StoreInit, DistinctPrefixesKeepTwoCommunicatorsApart) {
  FileStore store;
  runRanks(
      2,
      [&](RankContext& ctx) {
        braidStore_t first = store.callbacks("a/"), second = store.callbacks("b/");
        braidComm_t other = nullptr;
        RANK_ASSERT_OK(braidCommInitRankWithStore(&ctx.comm, 2, &first, ctx.rank));
        RANK_ASSERT_OK(braidCommInitRankWithStore(&other, 2, &second, ctx.rank));
        expectWorks(ctx.comm, ctx.rank, 2);
        expectWorks(other, ctx.rank, 2);
        RANK_EXPECT_OK(braidCommDestroy(other));
      },
      kTimeout, storeOptions());
}

TEST(StoreInit, AMissingKeyTimesOutNamingIt) {
  FileStore store;
  RunOptions options = storeOptions();
  options.braidTimeoutSeconds = 1;
  runRanks(
      1,
      [&](RankContext&) {
        braidStore_t s = store.callbacks("nobody/");
        braidComm_t comm = nullptr;
        auto start = std::chrono::steady_clock::now();
        // Rank 1 of 2 waits for a rank 0 that never comes.
        RANK_EXPECT_EQ(braidCommInitRankWithStore(&comm, 2, &s, 1), braidTimeout);
        double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        RANK_EXPECT_TRUE(seconds < 10) << seconds << " s";
        std::string message = braidGetLastError(nullptr);
        RANK_EXPECT_TRUE(message.find("nobody/braid/uniqueId") != std::string::npos) << message;
        RANK_EXPECT_TRUE(comm == nullptr);
      },
      kTimeout, options);
}

struct FakeStore {
  braidResult_t setResult = braidSuccess;
  braidResult_t getResult = braidSuccess;
  size_t valueBytes = BRAID_UNIQUE_ID_BYTES;

  braidStore_t callbacks() {
    return {this, nullptr,
            [](void* c, const char*, const void*, size_t) {
              return static_cast<FakeStore*>(c)->setResult;
            },
            [](void* c, const char*, void* value, size_t capacity, size_t* bytes, double) {
              auto* self = static_cast<FakeStore*>(c);
              std::memset(value, 0, std::min(capacity, self->valueBytes));
              *bytes = self->valueBytes;
              return self->getResult;
            }};
  }
};

void expectFailure(braidResult_t got, braidResult_t want, const std::vector<std::string>& words) {
  RANK_EXPECT_EQ(got, want);
  std::string message = braidGetLastError(nullptr);
  RANK_EXPECT_TRUE(message.starts_with("braidCommInitRankWithStore")) << message;
  for (const auto& w : words)
    RANK_EXPECT_TRUE(message.find(w) != std::string::npos) << "'" << w << "' not in: " << message;
}

TEST(StoreInit, BadArgumentsAndBadCallbacksGiveClearErrors) {
  RunOptions options = storeOptions();
  options.braidTimeoutSeconds = 2;  // the rendezvous of a failed rank 0 lingers this long
  runRanks(
      1,
      [](RankContext&) {
        braidComm_t comm = nullptr;
        FakeStore fake;
        braidStore_t s = fake.callbacks();
        expectFailure(braidCommInitRankWithStore(nullptr, 2, &s, 1), braidInvalidArgument,
                      {"comm"});
        expectFailure(braidCommInitRankWithStore(&comm, 2, nullptr, 1), braidInvalidArgument,
                      {"store"});
        braidStore_t noGet = s;
        noGet.get = nullptr;
        expectFailure(braidCommInitRankWithStore(&comm, 2, &noGet, 1), braidInvalidArgument,
                      {"get"});
        braidStore_t noSet = s;
        noSet.set = nullptr;
        expectFailure(braidCommInitRankWithStore(&comm, 2, &noSet, 1), braidInvalidArgument,
                      {"set"});
        expectFailure(braidCommInitRankWithStore(&comm, 2, &s, 2), braidInvalidArgument,
                      {"rank=2"});
        expectFailure(braidCommInitRankWithStore(&comm, 0, &s, 0), braidInvalidArgument,
                      {"nranks=0"});

        fake.valueBytes = 5;
        expectFailure(braidCommInitRankWithStore(&comm, 2, &s, 1), braidInvalidUsage,
                      {"braid/uniqueId", "5 bytes"});
        fake.valueBytes = BRAID_UNIQUE_ID_BYTES;
        fake.getResult = static_cast<braidResult_t>(42);
        expectFailure(braidCommInitRankWithStore(&comm, 2, &s, 1), braidInvalidArgument,
                      {"store->get", "42"});
        fake.getResult = braidRemoteError;
        expectFailure(braidCommInitRankWithStore(&comm, 2, &s, 1), braidRemoteError,
                      {"store->get", "braid/uniqueId"});
        fake.setResult = braidSystemError;
        expectFailure(braidCommInitRankWithStore(&comm, 2, &s, 0), braidSystemError,
                      {"store->set", "braid/uniqueId"});
        RANK_EXPECT_TRUE(comm == nullptr);
      },
      kTimeout, options);
}

// ---- braidStreamAddCallback ------------------------------------------------

struct CallbackLog {
  std::mutex mutex;
  std::vector<std::string> events;
  std::vector<braidResult_t> statuses;
  std::vector<std::string> messages;
  std::thread::id thread;
  const int64_t* watched = nullptr;  // value read when the callback runs
  std::vector<int64_t> seen;
  braidStream_t stream = nullptr;

  static void record(braidStream_t stream, braidResult_t status, void* userData) {
    auto* log = static_cast<CallbackLog*>(userData);
    std::lock_guard lock(log->mutex);
    log->events.push_back(stream == log->stream ? "callback" : "wrong stream");
    log->statuses.push_back(status);
    log->messages.push_back(braidGetLastError(nullptr));
    log->thread = std::this_thread::get_id();
    if (log->watched) log->seen.push_back(*log->watched);
  }
};

TEST(StreamCallback, RunsInOrderAfterTheCallsBeforeIt) {
  runRanks(
      3,
      [](RankContext& ctx) {
        braidStream_t stream = nullptr;
        RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &stream));
        CallbackLog log;
        log.stream = stream;
        std::vector<int64_t> data(3);
        log.watched = data.data();
        for (int i = 0; i < 3; ++i) {
          data[i] = (ctx.rank + 1) * (i + 1);
          // The callback after call i sees call i's result in data[0..i].
          RANK_ASSERT_OK(
              braidAllReduce(&data[i], &data[0], 1, braidInt64, braidSum, ctx.comm, stream));
          RANK_ASSERT_OK(braidStreamAddCallback(stream, &CallbackLog::record, &log));
        }
        RANK_ASSERT_OK(braidStreamSynchronize(stream));
        RANK_ASSERT_EQ(log.events.size(), size_t{3});
        for (int i = 0; i < 3; ++i) {
          RANK_EXPECT_EQ(log.events[i], std::string("callback"));
          RANK_EXPECT_EQ(log.statuses[i], braidSuccess);
          RANK_EXPECT_EQ(log.messages[i], std::string());
          RANK_EXPECT_EQ(log.seen[i], int64_t{6} * (i + 1));
        }
        RANK_EXPECT_TRUE(log.thread != std::this_thread::get_id());
        RANK_EXPECT_OK(braidStreamDestroy(stream));
      },
      kTimeout);
}

TEST(StreamCallback, SeesTheStreamsErrorAndItsMessage) {
  runRanks(
      2,
      [](RankContext& ctx) {
        braidStream_t stream = nullptr;
        RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &stream));
        CallbackLog log;
        log.stream = stream;
        std::vector<float> data(100, 1.0f);
        // Mismatched counts: both ranks' calls fail.
        RANK_ASSERT_OK(braidAllReduce(data.data(), data.data(), ctx.rank == 0 ? 10 : 20,
                                      braidFloat32, braidSum, ctx.comm, stream));
        RANK_ASSERT_OK(braidStreamAddCallback(stream, &CallbackLog::record, &log));
        RANK_ASSERT_OK(braidStreamAddCallback(stream, &CallbackLog::record, &log));
        RANK_EXPECT_EQ(braidStreamSynchronize(stream), braidInvalidUsage);
        RANK_ASSERT_EQ(log.statuses.size(), size_t{2});
        for (int i = 0; i < 2; ++i) {
          RANK_EXPECT_EQ(log.statuses[i], braidInvalidUsage);
          RANK_EXPECT_TRUE(log.messages[i].find("count=") != std::string::npos) << log.messages[i];
        }
        RANK_EXPECT_OK(braidStreamDestroy(stream));
      },
      kTimeout);
}

struct SelfWait {
  braidComm_t comm = nullptr;
  braidResult_t synchronize = braidSuccess, destroyStream = braidSuccess,
                destroyComm = braidSuccess, enqueue = braidInternalError;
  int64_t value = 0;

  static void run(braidStream_t stream, braidResult_t, void* userData) {
    auto* self = static_cast<SelfWait*>(userData);
    self->synchronize = braidStreamSynchronize(stream);
    self->destroyStream = braidStreamDestroy(stream);
    self->destroyComm = braidCommDestroy(self->comm);
    // Queuing more work from a callback is fine.
    self->enqueue =
        braidAllReduce(&self->value, &self->value, 1, braidInt64, braidSum, self->comm, stream);
  }
};

TEST(StreamCallback, CannotWaitForItsOwnStream) {
  runRanks(
      2,
      [](RankContext& ctx) {
        braidStream_t stream = nullptr;
        RANK_ASSERT_OK(braidStreamCreate(ctx.comm, &stream));
        SelfWait self;
        self.comm = ctx.comm;
        self.value = ctx.rank + 1;
        RANK_ASSERT_OK(braidStreamAddCallback(stream, &SelfWait::run, &self));
        RANK_ASSERT_OK(braidStreamSynchronize(stream));
        RANK_EXPECT_EQ(self.synchronize, braidInvalidUsage);
        RANK_EXPECT_EQ(self.destroyStream, braidInvalidUsage);
        RANK_EXPECT_EQ(self.destroyComm, braidInvalidUsage);
        RANK_EXPECT_EQ(self.enqueue, braidSuccess);
        RANK_EXPECT_EQ(self.value, int64_t{3});

        RANK_EXPECT_EQ(braidStreamAddCallback(stream, nullptr, nullptr), braidInvalidArgument);
        RANK_EXPECT_EQ(braidStreamAddCallback(nullptr, &SelfWait::run, &self),
                       braidInvalidArgument);
        RANK_ASSERT_OK(braidGroupStart());
        RANK_EXPECT_EQ(braidStreamAddCallback(stream, &SelfWait::run, &self), braidInvalidUsage);
        RANK_EXPECT_TRUE(std::string(braidGetLastError(nullptr)).find("braidGroupEnd") !=
                         std::string::npos);
        RANK_ASSERT_OK(braidGroupEnd());
        RANK_EXPECT_OK(braidStreamDestroy(stream));
      },
      kTimeout);
}

}  // namespace
}  // namespace braidtest
