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
           // Where every stream's calls start: their messages' tags.
           {"BRAID_FIRST_CALL_NUMBER is 4294967290 on rank 2 but 0 on rank 0",
            [](Config& c) { c.firstCallNumber = 4294967290u; }},
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

// Every size in bytes reads as BRAID_CUDA_IPC_SLOT_BYTES does: digits with
// an optional K, M or G (powers of 1024), and nothing else.
TEST(Config, ByteSizesTakeSuffixes) {
  {
    ScopedEnv chunk("BRAID_CHUNK_BYTES", "128K");
    ScopedEnv ring("BRAID_SHM_BYTES", "1M");
    ScopedEnv cma("BRAID_SHM_CMA_BYTES", "64k");
    auto c = loadConfig();
    ASSERT_TRUE(c.isOk()) << c.status().message();
    EXPECT_EQ(c->chunkBytes, size_t{128} << 10);
    EXPECT_EQ(c->shmRingBytes, size_t{1} << 20);
    EXPECT_EQ(c->shmCmaBytes, size_t{64} << 10);
  }
  for (auto [name, value] :
       std::vector<std::pair<const char*, const char*>>{{"BRAID_CHUNK_BYTES", "4.5K"},
                                                        {"BRAID_CHUNK_BYTES", "2G"},
                                                        {"BRAID_CHUNK_BYTES", "1e6"},
                                                        {"BRAID_SHM_BYTES", "3K"},
                                                        {"BRAID_SHM_BYTES", "-4096"},
                                                        {"BRAID_SHM_CMA_BYTES", "64KB"}}) {
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

TEST(Config, CudaIpcSlotsAreAutoUnlessSet) {
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
    if (!refused.isOk()) {
      EXPECT_NE(refused.status().message().find("BRAID_CUDA_IPC_SLOT_BYTES"), std::string::npos)
          << refused.status().message();
    }
  }
}

// By default only braidMemAlloc's memory is read in place, from 64 KiB; a
// size sets both minimums, 0 turns both off.
TEST(Config, CudaIpcReadsInPlaceAreForBraidMemAllocMemoryUnlessSet) {
  for (const char* unset : {"", "auto"}) {
    ScopedEnv direct("BRAID_CUDA_IPC_DIRECT_BYTES", unset);
    auto c = loadConfig();
    ASSERT_TRUE(c.isOk()) << unset;
    EXPECT_EQ(c->cudaIpcDirectBytes, 0u) << unset;
    EXPECT_EQ(c->cudaIpcHeldDirectBytes, size_t{64} << 10) << unset;
  }
  for (const auto& [text, bytes] : {std::pair{"0", size_t{0}}, std::pair{"1M", size_t{1} << 20}}) {
    ScopedEnv direct("BRAID_CUDA_IPC_DIRECT_BYTES", text);
    auto parsed = loadConfig();
    ASSERT_TRUE(parsed.isOk()) << text;
    EXPECT_EQ(parsed->cudaIpcDirectBytes, bytes);
    EXPECT_EQ(parsed->cudaIpcHeldDirectBytes, bytes);
  }
  for (const char* bad : {"-1", "2T", "some"}) {
    ScopedEnv direct("BRAID_CUDA_IPC_DIRECT_BYTES", bad);
    auto refused = loadConfig();
    ASSERT_FALSE(refused.isOk()) << bad;
    EXPECT_NE(refused.status().message().find("BRAID_CUDA_IPC_DIRECT_BYTES"), std::string::npos)
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
