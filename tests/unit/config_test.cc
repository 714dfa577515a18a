// The BRAID_* table: strict parsing, and the documentation lists exactly
// the registered variables.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "src/agreed_settings.h"
#include "src/bootstrap.h"
#include "src/common/byte_size.h"
#include "src/common/env.h"
#include "src/link_probe.h"
#include "src/progress.h"
#include "src/selector.h"

namespace braid {
namespace {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(Config, DefaultsWithoutVariables) {
  auto c = loadConfig();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c->timeoutSeconds, 300);
  EXPECT_TRUE(c->algo.empty());
}

// The settings every rank must share: equal lines pass; a difference names
// the setting, both values and the rank, whichever rank checks.
TEST(AgreedSettings, ADifferenceNamesTheSettingTheRankAndBothValues) {
  Config config;
  const std::string usual = agreedSettings(config);
  EXPECT_NE(usual.find("BRAID_CHUNK_BYTES=524288"), std::string::npos) << usual;
  EXPECT_TRUE(checkAgreedSettings(std::vector<std::string>{usual, usual, usual}).isOk());
  for (auto change : std::vector<std::pair<std::string, void (*)(Config&)>>{
           {"BRAID_CHUNK_BYTES is 65536 on rank 2 but 524288 on rank 0",
            [](Config& c) { c.chunkBytes = 65536; }},
           {"BRAID_ALGO is allreduce=ring on rank 2 but (unset) on rank 0",
            [](Config& c) { c.algo["allreduce"] = "ring"; }},
           {"BRAID_TUNE is measure on rank 2", [](Config& c) { c.tune = Config::Tune::kMeasure; }},
           {"BRAID_GPU_STAGING is whole on rank 2",
            [](Config& c) { c.gpuStagingPipelined = false; }},
           // The pipelining unit of GPU jobs: their plans must match.
           {"BRAID_CUDA_IPC_SLOT_BYTES is 4194304 on rank 2 but 33554432 on rank 0",
            [](Config& c) { c.cudaIpcSlotBytes = size_t{4} << 20; }},
           {"BRAID_LINK_GBPS is 12.5 on rank 2 but measured on rank 0",
            [](Config& c) { c.linkGigabytesPerSecond = 12.5; }},
       }) {
    Config other;
    change.second(other);
    const Status s =
        checkAgreedSettings(std::vector<std::string>{usual, usual, agreedSettings(other)});
    EXPECT_EQ(s.code(), ErrorCode::kInvalidUsage);
    EXPECT_NE(s.message().find(change.first), std::string::npos) << s.message();
  }
  // auto is the size it comes to.
  Config explicitDefault;
  explicitDefault.cudaIpcSlotBytes = kDefaultCudaIpcSlotBytes;
  EXPECT_TRUE(
      checkAgreedSettings(std::vector<std::string>{usual, agreedSettings(explicitDefault)}).isOk());
  // A line that does not even list the same settings: another build.
  const Status s = checkAgreedSettings(std::vector<std::string>{usual, "BRAID_CHUNK_BYTES=4096"});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidUsage);
  EXPECT_NE(s.message().find("different builds"), std::string::npos) << s.message();
}

// A rank's card at rendezvous carries its settings between its address and
// its topology; a value cannot break the line.
TEST(AgreedSettings, TravelOnTheRanksCard) {
  Config config;
  config.algo["allreduce"] = "ring\nBRAID_CHUNK_BYTES=1";
  topo::RankTopology topology;
  topology.hostId = "node-a/1";
  auto card =
      decodePublished(encodePublished("10.0.0.1:4000", agreedSettings(config), topology), 1);
  ASSERT_TRUE(card.isOk()) << card.status().message();
  EXPECT_EQ(card->address, "10.0.0.1:4000");
  EXPECT_EQ(card->settings, agreedSettings(config));
  EXPECT_EQ(card->topology.hostId, "node-a/1");
}

TEST(Config, UnknownVariableIsAnError) {
  ScopedEnv e("BRAID_TIMEOT", "5");
  auto c = loadConfig();
  ASSERT_FALSE(c.isOk());
  EXPECT_EQ(c.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("BRAID_TIMEOT"), std::string::npos);
}

TEST(Config, MalformedValuesAreErrors) {
  for (auto [name, value] :
       std::vector<std::pair<const char*, const char*>>{{"BRAID_TIMEOUT", "abc"},
                                                        {"BRAID_TIMEOUT", "-1"},
                                                        {"BRAID_TIMEOUT", "5s"},
                                                        {"BRAID_DEBUG", "LOUD"},
                                                        {"BRAID_TRANSPORT", "carrier-pigeon"},
                                                        {"BRAID_ALGO", "allreduce"},
                                                        {"BRAID_CHUNK_BYTES", "12"},
                                                        {"BRAID_IB_TIMEOUT", "0"},
                                                        {"BRAID_IB_TIMEOUT", "14.5"},
                                                        {"BRAID_IB_RETRY_CNT", "8"},
                                                        {"BRAID_IB_GID_INDEX", "-1"},
                                                        {"BRAID_SHM_BOARD", "yes"}}) {
    ScopedEnv e(name, value);
    auto c = loadConfig();
    ASSERT_FALSE(c.isOk()) << name << "=" << value;
    EXPECT_NE(c.status().message().find(name), std::string::npos) << c.status().message();
  }
}

TEST(Config, ParsesGoodValues) {
  ScopedEnv t("BRAID_TIMEOUT", "2.5");
  ScopedEnv a("BRAID_ALGO", "allreduce=ring,broadcast=tree");
  ScopedEnv d("BRAID_DEBUG", "info");
  auto c = loadConfig();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c->timeoutSeconds, 2.5);
  EXPECT_EQ(c->algo.at("allreduce"), "ring");
  EXPECT_EQ(c->algo.at("broadcast"), "tree");
}

TEST(Config, ParsesTheRdmaSettings) {
  {
    auto c = loadConfig();
    ASSERT_TRUE(c.isOk());
    EXPECT_EQ(c->ibGidIndex, -1);
    EXPECT_EQ(c->ibTimeout, 18);
    EXPECT_EQ(c->ibRetryCount, 7);
  }
  ScopedEnv h("BRAID_IB_HCA", "^mlx5_2");
  ScopedEnv g("BRAID_IB_GID_INDEX", "3");
  ScopedEnv t("BRAID_IB_TIMEOUT", "14");
  ScopedEnv r("BRAID_IB_RETRY_CNT", "0");
  auto c = loadConfig();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c->ibHca, "^mlx5_2");
  EXPECT_EQ(c->ibGidIndex, 3);
  EXPECT_EQ(c->ibTimeout, 14);
  EXPECT_EQ(c->ibRetryCount, 0);
}

TEST(Config, TuneIsTheModelUnlessSetToMeasure) {
  auto c = loadConfig();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c->tune, Config::Tune::kModel);
  for (auto [word, mode] : std::vector<std::pair<const char*, Config::Tune>>{
           {"model", Config::Tune::kModel}, {"measure", Config::Tune::kMeasure}}) {
    ScopedEnv t("BRAID_TUNE", word);
    auto parsed = loadConfig();
    ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
    EXPECT_EQ(parsed->tune, mode) << word;
  }
  ScopedEnv bad("BRAID_TUNE", "guess");
  auto refused = loadConfig();
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("model or measure"), std::string::npos)
      << refused.status().message();
}

TEST(Config, CudaIpcHandlesAreAutoUnlessSet) {
  auto c = loadConfig();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c->cudaIpcHandles, Config::CudaIpcHandles::kAuto);
  using H = Config::CudaIpcHandles;
  for (auto [word, mode] : std::vector<std::pair<const char*, H>>{
           {"auto", H::kAuto}, {"legacy", H::kLegacy}, {"fd", H::kPosixFd}}) {
    ScopedEnv h("BRAID_CUDA_IPC_HANDLES", word);
    auto parsed = loadConfig();
    ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
    EXPECT_EQ(parsed->cudaIpcHandles, mode) << word;
  }
  ScopedEnv bad("BRAID_CUDA_IPC_HANDLES", "posix");
  auto refused = loadConfig();
  ASSERT_FALSE(refused.isOk());
  EXPECT_NE(refused.status().message().find("auto, legacy and fd"), std::string::npos)
      << refused.status().message();
}

TEST(Config, CudaIpcSlotsFollowTheChunkUnlessSet) {
  auto c = loadConfig();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c->cudaIpcSlotBytes, 0u);
  {
    ScopedEnv slot("BRAID_CUDA_IPC_SLOT_BYTES", "4M");
    auto parsed = loadConfig();
    ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
    EXPECT_EQ(parsed->cudaIpcSlotBytes, size_t{4} << 20);
  }
  for (const char* bad : {"4100", "1K", "2G", "many"}) {
    ScopedEnv slot("BRAID_CUDA_IPC_SLOT_BYTES", bad);
    auto refused = loadConfig();
    EXPECT_FALSE(refused.isOk()) << bad;
    if (!refused.isOk())
      EXPECT_NE(refused.status().message().find("BRAID_CUDA_IPC_SLOT_BYTES"), std::string::npos)
          << refused.status().message();
  }
}

TEST(Config, CudaIpcConnectWaitIsThirtySecondsUnlessSet) {
  auto c = loadConfig();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c->cudaIpcConnectSeconds, 30.0);
  {
    ScopedEnv wait("BRAID_CUDA_IPC_CONNECT_SECONDS", "0");
    auto parsed = loadConfig();
    ASSERT_TRUE(parsed.isOk()) << parsed.status().message();
    EXPECT_EQ(parsed->cudaIpcConnectSeconds, 0.0);
  }
  for (const char* bad : {"-1", "3601", "soon"}) {
    ScopedEnv wait("BRAID_CUDA_IPC_CONNECT_SECONDS", bad);
    auto refused = loadConfig();  // an error naming the variable
    EXPECT_NE(refused.status().message().find("BRAID_CUDA_IPC_CONNECT_SECONDS"), std::string::npos)
        << bad;
  }
}

TEST(Config, SingleCopyThresholdIs64KiBOrWhatDoesNotFitASmallerRing) {
  auto c = loadConfig();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_TRUE(c->shmCmaAuto);
  EXPECT_EQ(c->shmCmaBytes, 64u << 10);
  EXPECT_EQ(singleCopyBytes(1 << 20), 64u << 10);
  EXPECT_EQ(singleCopyBytes(1 << 17), 64u << 10);
  EXPECT_EQ(singleCopyBytes(1 << 16), 1u << 16);
  // Below, what does not fit the ring (a message exactly the ring's size
  // does not, with its frame header).
  EXPECT_EQ(singleCopyBytes(1 << 15), (1u << 15) + 1);
  EXPECT_EQ(singleCopyBytes(1 << 12), (1u << 12) + 1);
  {
    ScopedEnv ring("BRAID_SHM_BYTES", "16384");
    auto small = loadConfig();
    ASSERT_TRUE(small.isOk()) << small.status().message();
    EXPECT_EQ(small->shmCmaBytes, 16385u);
    EXPECT_FALSE(small->shmRingAuto);  // a size given is kept as it is
  }
  EXPECT_TRUE(c->shmRingAuto);
  {
    ScopedEnv ring("BRAID_SHM_BYTES", "auto");
    auto automatic = loadConfig();
    ASSERT_TRUE(automatic.isOk()) << automatic.status().message();
    EXPECT_TRUE(automatic->shmRingAuto);
    EXPECT_EQ(automatic->shmRingBytes, 1u << 20);
  }
  ScopedEnv given("BRAID_SHM_CMA_BYTES", "4096");
  auto fixed = loadConfig();
  ASSERT_TRUE(fixed.isOk()) << fixed.status().message();
  EXPECT_FALSE(fixed->shmCmaAuto);
  EXPECT_EQ(fixed->shmCmaBytes, 4096u);
}

TEST(Config, FaultsAreOffUnlessSet) {
  auto c = loadConfig();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_FALSE(c->faults.enabled());
}

TEST(Config, ParsesFaults) {
  ScopedEnv f("BRAID_FAULTS", "drop=1e-4,delay=1e-3,close=1e-5,delay_ms=2.5,seed=7");
  auto c = loadConfig();
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_TRUE(c->faults.enabled());
  EXPECT_EQ(c->faults.drop, 1e-4);
  EXPECT_EQ(c->faults.delay, 1e-3);
  EXPECT_EQ(c->faults.close, 1e-5);
  EXPECT_EQ(c->faults.delayMs, 2.5);
  EXPECT_EQ(c->faults.seed, 7u);
  auto partial = parseFaultSpec("seed=18446744073709551615,close=1");
  ASSERT_TRUE(partial.isOk()) << partial.status().message();
  EXPECT_EQ(partial->seed, 18446744073709551615ull);
  EXPECT_EQ(partial->drop, 0);
}

TEST(Config, MalformedFaultsAreErrorsNamingTheVariableAndTheItem) {
  for (const char* bad :
       {"drop", "drop=", "=0.1", "drop=0.1,", "drop=2", "drop=-0.1", "drop=abc", "drop=nan",
        "drop=0.1,drop=0.2", "loss=0.1", "drop= 0.1", "seed=-1", "seed=1.5",
        "seed=99999999999999999999", "delay_ms=0", "drop=0.6,close=0.6", "drop=0.1;delay=0.1"}) {
    ScopedEnv f("BRAID_FAULTS", bad);
    auto c = loadConfig();
    ASSERT_FALSE(c.isOk()) << bad;
    EXPECT_EQ(c.status().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(c.status().message().find("BRAID_FAULTS"), std::string::npos) << c.status().message();
  }
}

TEST(Config, DocumentationListsExactlyTheRegisteredVariables) {
  const char* root = std::getenv("SOURCE_ROOT");
  ASSERT_NE(root, nullptr);
  std::ifstream file(std::string(root) + "/docs/ENVIRONMENT.md");
  ASSERT_TRUE(file) << "docs/ENVIRONMENT.md is missing";
  std::stringstream text;
  text << file.rdbuf();
  std::set<std::string> documented, registered;
  std::regex row(R"(^\| `(BRAID_[A-Z_]+)` \|)");
  std::string line;
  while (std::getline(text, line)) {
    std::smatch m;
    if (std::regex_search(line, m, row)) documented.insert(m[1]);
  }
  for (const auto& p : envParams()) registered.insert(std::string(p.name));
  EXPECT_EQ(documented, registered);
}

TEST(ByteSize, ParsesWhatPeopleTypeAndRejectsTheRest) {
  EXPECT_EQ(parseByteSize("0"), 0u);
  EXPECT_EQ(parseByteSize("4096"), 4096u);
  EXPECT_EQ(parseByteSize("64K"), 64u << 10);
  EXPECT_EQ(parseByteSize("32m"), 32u << 20);
  EXPECT_EQ(parseByteSize("1G"), size_t{1} << 30);
  for (const char* bad : {"", "K", "-1", "+1", "1Q", "1KB", "1.5M", " 1", "1 ", "0x10",
                          "99999999999999999999", "17179869184G"})
    EXPECT_EQ(parseByteSize(bad), std::nullopt) << "'" << bad << "'";
}

TEST(UniqueId, RoundTripsAndRejectsGarbage) {
  RendezvousInfo info;
  info.root = *tcp::SocketAddress::parse("127.0.0.1:4242");
  for (size_t i = 0; i < info.secret.size(); ++i) info.secret[i] = static_cast<uint8_t>(i * 13);
  char id[kUniqueIdBytes];
  info.encode(id);
  auto back = RendezvousInfo::decode(id);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->root.toString(), "127.0.0.1:4242");
  EXPECT_EQ(back->secret, info.secret);
  char garbage[kUniqueIdBytes];
  for (size_t i = 0; i < kUniqueIdBytes; ++i) garbage[i] = static_cast<char>(i * 31 + 5);
  EXPECT_EQ(RendezvousInfo::decode(garbage).status().code(), ErrorCode::kInvalidArgument);
}

TEST(CallSignature, PacksAndDescribes) {
  CallSignature s{0, DataType::kBfloat16, RedOp::kMax, 3, 123456};
  CallSignature back = CallSignature::unpack(s.pack());
  EXPECT_EQ(back.dtype, DataType::kBfloat16);
  EXPECT_EQ(back.op, RedOp::kMax);
  EXPECT_EQ(back.root, 3);
  EXPECT_EQ(back.count, 123456u);
  EXPECT_EQ(back.describe(), "allreduce(count=123456, bfloat16, max, root=3)");
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

TEST(BootstrapInterface, NamedInterfaceIsUsed) {
  auto chosen = chooseBootstrapAddress("lo", Deadline::after(5));
  ASSERT_TRUE(chosen.isOk()) << chosen.status().message();
  EXPECT_TRUE(chosen->isLoopback()) << chosen->toString();
}

TEST(BootstrapInterface, UnknownInterfaceIsAnErrorNamingIt) {
  auto chosen = chooseBootstrapAddress("nosuchif0", Deadline::after(5));
  ASSERT_FALSE(chosen.isOk());
  EXPECT_EQ(chosen.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(chosen.status().message().find("nosuchif0"), std::string::npos);
}

TEST(BootstrapInterface, AutomaticChoiceAcceptsConnections) {
  auto chosen = chooseBootstrapAddress("", Deadline::after(5));
  ASSERT_TRUE(chosen.isOk()) << chosen.status().message();
  auto listener = tcp::listenOn(*chosen);
  ASSERT_TRUE(listener.isOk()) << listener.status().message();
  auto bound = tcp::SocketAddress::ofSocket(listener->get(), false);
  ASSERT_TRUE(bound.isOk());
  EXPECT_TRUE(tcp::connectTo(*bound, Deadline::after(2)).isOk()) << bound->toString();
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

TEST(Selector, UnknownNamesInBraidAlgoAreErrorsListingTheKnownOnes) {
  auto bad = Selector::validate({{"allreduce", "teleport"}});
  EXPECT_EQ(bad.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("teleport"), std::string::npos);
  EXPECT_NE(bad.message().find("ring"), std::string::npos) << bad.message();
  auto badCollective = Selector::validate({{"allreduse", "ring"}});
  EXPECT_EQ(badCollective.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(badCollective.message().find("allreduse"), std::string::npos);
  EXPECT_TRUE(Selector::validate({{"allreduce", "ring"}, {"broadcast", "tree"}}).isOk());
}

TEST(Selector, ForcedAlgorithmWinsOverTheModel) {
  Selector s({{"allreduce", "ring"}}, algo::LinkModel{});
  algo::CollectiveArgs args;
  args.nranks = 4;
  for (size_t count : {size_t{1}, size_t{1} << 24}) {
    args.count = count;
    EXPECT_EQ(s.choose(args).name, "ring");
  }
}

TEST(Selector, ChoosesTheLowestEstimate) {
  Selector s({}, algo::LinkModel{});
  for (int P : {2, 3, 8, 64})
    for (size_t count : {size_t{1}, size_t{1000}, size_t{1} << 22}) {
      algo::CollectiveArgs args;
      args.nranks = P;
      args.count = count;
      const algo::Algorithm& chosen = s.choose(args);
      for (const auto& a : algo::allAlgorithms()) {
        if (a.kind != args.kind) continue;
        EXPECT_LE(chosen.estimate(args, s.link()).seconds, a.estimate(args, s.link()).seconds)
            << chosen.name << " vs " << a.name << " P=" << P << " count=" << count;
      }
    }
}

// At 2 ranks the model ties ring, halving and dbtree (each rank sends and
// reduces half the vector in two rounds); dbtree measured fastest there.
TEST(Selector, TwoRankTiesAmongTheBandwidthAlgorithmsGoToDbtree) {
  algo::LinkModel link;
  link.alpha = 0.6e-6;
  link.beta = 1.0 / 17e9;
  link.gamma = 1.0 / 43e9;
  Selector s({}, link);
  algo::CollectiveArgs args;
  args.nranks = 2;
  for (size_t bytes : {size_t{1} << 17, size_t{1} << 21, size_t{1} << 25}) {
    args.count = bytes / 4;
    const double ring = algo::findAlgorithm(args.kind, "ring")->estimate(args, link).seconds;
    const double dbtree = algo::findAlgorithm(args.kind, "dbtree")->estimate(args, link).seconds;
    EXPECT_NEAR(ring, dbtree, ring * 1e-9) << bytes;
    EXPECT_EQ(s.choose(args).name, "dbtree") << bytes;
  }
}

// Figures measured with every rank of a host busy already hold its
// sharing; only fewer busy ranks change a round's time.
TEST(LinkModel, StretchIsRelativeToTheBusyRanksOfTheMeasurement) {
  algo::LinkModel link;
  link.coresPerHost = 2;
  link.ranksPerHost = 3;
  // Measured by two ranks: the cores are shared evenly beyond them.
  EXPECT_DOUBLE_EQ(link.stretch(2, 3), 1.0);
  EXPECT_DOUBLE_EQ(link.stretch(3, 3), 1.5);
  // Measured by all three, 2.5 times as slow as by two.
  link.busyWhenMeasured = 3;
  link.contention = 2.5;
  EXPECT_DOUBLE_EQ(link.stretch(3, 3), 1.0);
  EXPECT_DOUBLE_EQ(link.stretch(2, 3), 1 / 2.5);
  EXPECT_DOUBLE_EQ(link.stretch(1, 3), 1 / 2.5);
  // Without a measured contention, an even share: 3 busy on 2 cores is 1.5.
  link.contention = 1.0;
  EXPECT_DOUBLE_EQ(link.stretch(2, 3), 1 / 1.5);
  // Ranks that do not outnumber the cores never stretch.
  link.coresPerHost = 4;
  link.busyWhenMeasured = 3;
  link.contention = 1.7;
  EXPECT_DOUBLE_EQ(link.stretch(3, 3), 1.0);
  EXPECT_DOUBLE_EQ(link.stretch(1, 3), 1.0);
}

// 3 ranks on 2 cores, with the figures the probe measured there: halving's
// fold leaves one rank waiting, so its rounds run on a core each and beat
// the ring, which keeps all three busy (measured: 268 against 362 us at
// 1 MiB, perf/tuner_check.py). An even share of the cores predicted the ring.
TEST(Selector, ThreeRanksOnTwoCoresPreferTheFoldToTheRing) {
  algo::LinkModel link;
  link.alpha = 2e-6;
  link.beta = 1.0 / 7.5e9;
  link.gamma = 1.0 / 40e9;
  link.coresPerHost = 2;
  link.ranksPerHost = 3;
  link.busyWhenMeasured = 3;
  link.contention = 2.5;
  Selector s({}, link);
  algo::CollectiveArgs args;
  args.nranks = 3;
  for (size_t bytes : {size_t{256} << 10, size_t{1} << 20}) {
    args.count = bytes / 4;
    EXPECT_EQ(s.choose(args).name, "halving") << bytes;
  }
}

// Between the cached size (1 MiB) and the uncached one (4 MiB) the figures
// move in step with log2 of the size: 2 MiB is half way.
TEST(LinkModel, AtSizeMovesToTheUncachedFigures) {
  algo::LinkModel link;
  link.beta = 1.0;
  link.contention = 2.5;
  EXPECT_DOUBLE_EQ(link.atSize(64e6).beta, 1.0);  // nothing measured out of cache
  link.cachedBytes = 1 << 20;
  link.largeBytes = 4 << 20;
  link.largeBeta = 3.0;
  link.largeContention = 1.5;
  EXPECT_DOUBLE_EQ(link.atSize(1 << 19).beta, 1.0);
  EXPECT_DOUBLE_EQ(link.atSize(1 << 19).contention, 2.5);
  EXPECT_DOUBLE_EQ(link.atSize(2 << 20).beta, 2.0);
  EXPECT_DOUBLE_EQ(link.atSize(2 << 20).contention, 2.0);
  EXPECT_DOUBLE_EQ(link.atSize(64 << 20).beta, 3.0);
  EXPECT_DOUBLE_EQ(link.atSize(64 << 20).contention, 1.5);
  EXPECT_DOUBLE_EQ(link.atSize(64 << 20).alpha, link.alpha);
}

// 3 ranks on 2 cores, with figures one init measured: a cached 1 MiB round
// 5.5x as slow with three ranks busy as with two, a 4 MiB one 1.75x. Out of
// cache the ring's extra busy rank costs less than halving's fold and
// unfold move (the ring measured 1.15-1.24x faster at 4 MiB).
// The probe's contention figure: batch by batch, so that one disturbed
// batch of either kind (here the pair's 3rd, 5x slow) does not move it.
TEST(LinkModel, ContentionIsTheMedianOfTheBatchRatios) {
  const std::vector<double> whole = {160, 150, 600, 170, 155};
  const std::vector<double> pair = {60, 65, 600, 70, 300};
  EXPECT_DOUBLE_EQ(medianRatio(whole, pair), 150.0 / 65);
  // An even count takes the mean of the middle two; the longer list's
  // extra entries have no partner and are left out.
  EXPECT_DOUBLE_EQ(medianRatio({2, 3, 4, 9}, {1, 1, 1}), 3.0);
  EXPECT_DOUBLE_EQ(medianRatio({2, 4}, {1, 1}), 3.0);
  EXPECT_DOUBLE_EQ(medianRatio({}, {}), 1.0);
  EXPECT_DOUBLE_EQ(medianRatio({5}, {0}), 1.0);
}

TEST(Selector, ThreeRanksOnTwoCoresTakeTheRingOutOfCache) {
  algo::LinkModel link;
  link.alpha = 2.24e-6;
  link.beta = 1.0 / 1.62e9;
  link.gamma = 1.0 / 14.6e9;
  link.coresPerHost = 2;
  link.ranksPerHost = 3;
  link.busyWhenMeasured = 3;
  link.contention = 5.54;
  algo::CollectiveArgs args;
  args.nranks = 3;
  args.count = (size_t{4} << 20) / 4;
  EXPECT_EQ(Selector({}, link).choose(args).name, "halving") << "cached figures only";
  link.cachedBytes = 1 << 20;
  link.largeBytes = 4 << 20;
  link.largeBeta = 1.0 / 1.62e9;
  link.largeContention = 1.75;
  Selector s({}, link);
  for (size_t bytes : {size_t{4} << 20, size_t{64} << 20}) {
    args.count = bytes / 4;
    EXPECT_EQ(s.choose(args).name, "ring") << bytes;
  }
  args.count = (size_t{1} << 20) / 4;
  EXPECT_EQ(s.choose(args).name, "halving");
}

TEST(Selector, ShortlistHoldsWhatTheModelPredictsWithinItsFactor) {
  algo::LinkModel link;
  link.alpha = 0.6e-6;
  link.beta = 1.0 / 17e9;
  link.gamma = 1.0 / 43e9;
  link.coresPerHost = 2;
  link.ranksPerHost = 4;
  Selector s({}, link);
  for (size_t bytes : {size_t{8}, size_t{1} << 15, size_t{1} << 24}) {
    algo::CollectiveArgs args;
    args.nranks = 4;
    args.count = bytes / 4;
    const auto list = s.shortlist(args);
    const algo::Algorithm& chosen = s.choose(args);
    const double best = chosen.estimate(args, link).seconds;
    EXPECT_NE(std::find(list.begin(), list.end(), &chosen), list.end()) << bytes;
    for (const auto& a : algo::allAlgorithms()) {
      if (a.kind != args.kind) continue;
      const bool listed = std::find(list.begin(), list.end(), &a) != list.end();
      EXPECT_EQ(listed, a.estimate(args, link).seconds <= best * Selector::kShortlistFactor)
          << a.name << " at " << bytes;
    }
  }
  // At 8 bytes the ring (6 rounds against butterfly's 2) is not worth a call.
  algo::CollectiveArgs small;
  small.nranks = 4;
  small.count = 2;
  for (const algo::Algorithm* a : s.shortlist(small)) EXPECT_NE(a->name, "ring");
  Selector forced({{"allreduce", "ring"}}, link);
  const auto only = forced.shortlist(small);
  ASSERT_EQ(only.size(), 1u);
  EXPECT_EQ(only[0]->name, "ring");
}

// The race behind a flaky abort test: when the call's own thread saw the
// abort flag before the aborting thread reached the connections, peers were
// told "communicator aborted" as misuse instead of losing rank 0.
TEST(Progress, PeersOfACallItsRankAbortedHearOfALostRank) {
  std::atomic<bool> aborted{true};
  Job job;
  job.rank = 3;
  job.aborted = &aborted;
  Status told = reasonForPeers(job, invalidUsage("braidAllReduce #1: communicator aborted"));
  EXPECT_EQ(told.code(), ErrorCode::kRemoteError);
  EXPECT_NE(told.message().find("rank 3 aborted"), std::string::npos) << told.message();
  aborted = false;
  Status mismatch = invalidUsage("braidAllReduce #2 count 5 on rank 3: rank 1 called count 6");
  EXPECT_EQ(reasonForPeers(job, mismatch).code(), ErrorCode::kInvalidUsage);
  EXPECT_EQ(reasonForPeers(job, mismatch).message(), mismatch.message());
}

}  // namespace
}  // namespace braid
