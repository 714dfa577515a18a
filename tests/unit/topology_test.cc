// Topology once detected: the encoding exchanged at init, the JSON forms, each pair's transport.
// Transports are chosen for injected topologies; detection is topology_detect_test.cc.
#include "topology/topology.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "src/common/env.h"
#include "tests/unit/topology_fixtures.h"
#include "topology/topology_json.h"

namespace braid::topo {
namespace {

namespace fs = std::filesystem;

PciDevice gpu(int numa = 0, uint16_t vendor = kNvidiaVendor) {
  return {DeviceKind::kGpu, "0000:3b:00.0", vendor, 0x2330, numa, {}, {}};
}
PciDevice ibNic(int numa = 0) {
  return {DeviceKind::kInfiniband, "0000:5e:00.0", 0x15b3, 0x101b, numa, {"ib0"}, {"mlx5_0"}};
}
PciDevice ethNic() {
  return {DeviceKind::kEthernet, "0000:00:03.0", 0x1af4, 0x1041, -1, {"eth0"}, {}};
}

// Two hosts, two ranks each; rank 0 and 1 on host a, 2 and 3 on host b.
std::vector<RankTopology> twoByTwo(std::vector<PciDevice> devices = {}) {
  return {rankOn("a", 0, devices), rankOn("a", 1, devices), rankOn("b", 0, devices),
          rankOn("b", 0, devices)};
}

constexpr TransportSet kShmOnly{false, true, false};
constexpr TransportSet kAll{true, true, true};

std::vector<std::string> transportGrid(const TransportMatrix& m) {
  std::vector<std::string> rows;
  for (int a = 0; a < m.size(); ++a) {
    std::string row;
    for (int b = 0; b < m.size(); ++b)
      row += std::string(b ? " " : "") + std::string(transportName(m.at(a, b).transport));
    rows.push_back(row);
  }
  return rows;
}

// --- encoding -----------------------------------------------------------

RankTopology awkward() {
  RankTopology r = rankOn("host with spaces,+%~", 1, {gpu(1), ibNic(1), ethNic()});
  r.hostId = "";  // empty strings survive too
  r.pid = 4194304;
  r.cores = {0, 1, 2, 3, 8, 10, 11, 1023};
  r.devices[2].netNames = {"eth0", "ens1f0 np0", "ü"};
  r.devices[0].uuid = "GPU-5f1c2e00-aaaa-bbbb-cccc-0123456789ab";
  r.transports = {true, false, true};
  return r;
}

TEST(Encoding, RoundTrips) {
  for (const RankTopology& r : {awkward(), detect(), RankTopology{}}) {
    std::string text = r.encode();
    EXPECT_LE(text.size(), kMaxEncodedBytes);
    EXPECT_EQ(text.find('\n'), std::string::npos);
    auto back = RankTopology::decode(text);
    ASSERT_TRUE(back.isOk()) << back.status().message() << "\n" << text;
    EXPECT_EQ(back.value(), r) << text;
    // As it arrives from a fixed-size AllGather slot.
    std::string slot = text + std::string(kMaxEncodedBytes - text.size(), '\0');
    auto padded = RankTopology::decode(slot);
    ASSERT_TRUE(padded.isOk()) << padded.status().message();
    EXPECT_EQ(padded.value(), r);
  }
}

TEST(Encoding, RejectsGarbage) {
  std::string good = awkward().encode();
  std::vector<std::string> bad = {
      "",
      std::string(64, '\0'),
      "T2",
      "T3 h h 1 0 0 7 0",
      "T2 h h 1 0 0 7 0 ",
      "T2 h h 1 0 0 7 0 extra",
      "T2 h h -1 0 0 7 0",
      "T2 h h 1 -2 0 7 0",
      "T2 h h 1 0 5-3 7 0",
      "T2 h h 1 0 0-999999999 7 0",
      "T2 h h 1 0 0 8 0",
      "T2 h h 1 0 0 7 1",
      "T2 h h 1 0 0 7 99999999999",
      "T2 h%G1 h 1 0 0 7 0",
      "T2 h%4 h 1 0 0 7 0",
      "T2 h  1 0 0 7 0",
      "T2 h h 1 0 0 7 1 x,0000:01:00.0,10de,2330,0,~,~,~",
      "T2 h h 1 0 0 7 1 g,0000:01:00.0,10de,2330,0,~,~",
      "T2 h h 1 0 0 7 1 g,0000:01:00.0,110de,2330,0,~,~,~",
      "T2 h h 1 0 0 7 1 g,~,10de,2330,0,~,~,~",
      "T2 h h 1 0 0 7 1 g,0000:01:00.0,10de,2330,0,a++b,~,~",
      "T2 h h 1 0 0 7 1 g,0000:01:00.0,10de,2330,0,~,~,GPU-%G1",
      "T2 h h 1 0 0 7 1 e,0000:01:00.0,8086,1572,-1,eth0,~,GPU-1",
      "T1 h h 1 0 0 7 0",
      std::string("T2 h h 1 0 0 7 0\0x", 18),
  };
  for (const std::string& text : bad) {
    auto r = RankTopology::decode(text);
    EXPECT_FALSE(r.isOk()) << "accepted: '" << text << "'";
    if (!r.isOk()) {
      EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    }
  }
  // Every truncation and random mutations: an answer, never a crash.
  for (size_t n = 0; n < good.size(); ++n) (void)RankTopology::decode(good.substr(0, n));
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::string text = good;
    for (int k = 0; k < 1 + i % 4; ++k)
      text[rng() % text.size()] = static_cast<char>(i % 2 ? " ,+%~-0"[rng() % 7] : rng() % 256);
    (void)RankTopology::decode(text);
  }
  for (int i = 0; i < 2000; ++i) {
    std::string text(rng() % 200, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 256);
    if (i % 2) text = "T2 " + text;
    (void)RankTopology::decode(text);
  }
}

TEST(Encoding, TheVersionTagNamesTheMismatch) {
  auto r = RankTopology::decode("T1 h h 1 0 0 7 0");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("another braid version"), std::string::npos)
      << r.status().message();
}

TEST(NvidiaGpuUuid, ReadsTheDriversLine) {
  // The layout of /proc/driver/nvidia/gpus/<bus id>/information: a label,
  // then tabs and spaces, then the value.
  const std::string information =
      "Model: \t\t NVIDIA H100 80GB HBM3\n"
      "IRQ:   \t\t 255\n"
      "GPU UUID: \t GPU-0c2f9d3e-51a7-4b1e-9d0a-7e3f2b6c8a41\n"
      "Video BIOS: \t 96.00.99.00.01\n"
      "Bus Location: \t 0000:3b:00.0\n";
  EXPECT_EQ(nvidiaGpuUuid(information), "GPU-0c2f9d3e-51a7-4b1e-9d0a-7e3f2b6c8a41");
  EXPECT_EQ(nvidiaGpuUuid("GPU UUID: GPU-1\r"), "GPU-1") << "the last line, no newline";
  EXPECT_EQ(nvidiaGpuUuid(""), "");
  EXPECT_EQ(nvidiaGpuUuid("Model: \t NVIDIA H100\nIRQ: 5\n"), "") << "no UUID line";
  EXPECT_EQ(nvidiaGpuUuid("GPU UUID: \t \n"), "") << "an empty value";
  EXPECT_EQ(nvidiaGpuUuid("GPU UUID: not a uuid\n"), "") << "more than one word";
  EXPECT_EQ(nvidiaGpuUuid(" GPU UUID: GPU-1\n"), "") << "a label not at the line's start";
}

TEST(Encoding, OversizedDescriptionKeepsWhatTransportsNeed) {
  RankTopology r = rankOn("big", 0);
  for (int i = 0; i < 300; ++i) {
    PciDevice eth = ethNic();
    eth.busId = "0000:" + std::to_string(100 + i) + ":00.0";
    eth.netNames = {std::string(40, 'n') + std::to_string(i)};
    r.devices.push_back(eth);
  }
  r.devices.push_back(ibNic());
  r.devices.push_back(gpu());
  std::string text = r.encode();
  EXPECT_LE(text.size(), kMaxEncodedBytes);
  auto back = RankTopology::decode(text);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_TRUE(back->hasNvidiaGpu());
  EXPECT_TRUE(back->hasIbDevice());
  EXPECT_EQ(back->cores, r.cores);
}

TEST(CpuList, FormatsAndParses) {
  EXPECT_EQ(formatCpuList(std::vector<int>{3, 0, 1, 2, 8, 10, 11, 11}), "0-3,8,10-11");
  EXPECT_EQ(formatCpuList(std::vector<int>{}), "");
  EXPECT_EQ(parseCpuList("0-3,8,10-11\n").value(), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_TRUE(parseCpuList("").value().empty());
  for (const char* bad : {"a", "1-", "-1", "3-1", "1,,2", "0-2000000"})
    EXPECT_FALSE(parseCpuList(bad).isOk()) << bad;
}

// --- JSON -----------------------------------------------------------------

TEST(Json, RoundTrips) {
  RankTopology named = awkward();
  named.hostId = "id with spaces";  // JSON reads an empty host_id as the hostname
  for (const RankTopology& r : {named, detect()}) {
    std::string text = toJson(r, 2);
    auto back = rankFromJson(text);
    ASSERT_TRUE(back.isOk()) << back.status().message() << "\n" << text;
    EXPECT_EQ(back.value(), r) << text;
  }
}

TEST(Json, ShortHandFilledIn) {
  auto r = rankFromJson(R"({"hostname": "n1", "devices": [{"kind": "ib"}, {"kind": "gpu",
                           "vendor": 4318}], "cores": [3, 1, 2]})");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r->hostId, "n1");
  EXPECT_EQ(r->numaNode, -1);
  EXPECT_EQ(r->cores, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(r->hasIbDevice());
  EXPECT_TRUE(r->hasNvidiaGpu());
  EXPECT_EQ(r->transports, kAll);
}

TEST(Json, RejectsMalformed) {
  for (const char* text : {
           "",
           "{",
           "[]",
           "42",
           R"({"pid": 3})",
           R"({"hostname": 5})",
           R"({"hostname": "a", "hostnmae": "b"})",
           R"({"hostname": "a", "pid": -1})",
           R"({"hostname": "a", "pid": 1.5})",
           R"({"hostname": "a", "numa_node": -2})",
           R"({"hostname": "a", "cores": "x"})",
           R"({"hostname": "a", "cores": [-1]})",
           R"({"hostname": "a", "devices": {}})",
           R"({"hostname": "a", "devices": [{"kind": "tpu"}]})",
           R"({"hostname": "a", "devices": [{"kind": "gpu", "vendor": "0x1234567"}]})",
           R"({"hostname": "a", "devices": [{"kind": "eth", "net": [""]}]})",
           R"({"hostname": "a", "devices": [{"kind": "eth", "uuid": "GPU-1"}]})",
           R"({"hostname": "a", "devices": [{"kind": "gpu", "uuid": 7}]})",
           R"({"hostname": "a", "transports": ["shm", "carrier-pigeon"]})",
       }) {
    auto r = rankFromJson(text);
    EXPECT_FALSE(r.isOk()) << text;
  }
  for (const std::string& text : {std::string(R"({"hostname": "a", "pid": 18446744073709551615})"),
                                  R"({"hostname": ")" + std::string(300, 'h') + R"("})",
                                  R"({"hostname": "a", "devices": [{"kind": "eth", "bus_id": ")" +
                                      std::string(300, 'b') + R"("}]})"}) {
    EXPECT_FALSE(rankFromJson(text).isOk()) << text;
  }
  // The longest strings a file may hold still fit the exchange slot.
  RankTopology longest = rankOn(std::string(256, ' '), 0);
  longest.hostId = std::string(256, '%');
  EXPECT_LE(longest.encode().size(), kMaxEncodedBytes);
  auto unknown = rankFromJson(R"({"hostname": "a", "hostnmae": "b"})");
  EXPECT_NE(unknown.status().message().find("hostnmae"), std::string::npos);
}

TEST(Json, FileForms) {
  auto array = parseTopologyJson(R"([{"hostname": "a"}, {"hostname": "b", "rank": 1}])");
  ASSERT_TRUE(array.isOk()) << array.status().message();
  EXPECT_FALSE(array->shared);
  EXPECT_EQ(array->entry(1, 2).value().hostname, "b");
  EXPECT_FALSE(array->entry(2, 3).isOk());
  EXPECT_FALSE(array->entry(0, 3).isOk()) << "a file for 2 ranks used by 3";

  auto wrapped = parseTopologyJson(R"({"ranks": [{"hostname": "a"}], "matrix": null})");
  ASSERT_TRUE(wrapped.isOk()) << wrapped.status().message();
  EXPECT_EQ(wrapped->ranks.size(), 1u);

  auto single = parseTopologyJson(R"({"hostname": "a"})");
  ASSERT_TRUE(single.isOk()) << single.status().message();
  EXPECT_TRUE(single->shared);
  EXPECT_EQ(single->entry(5, 8).value().hostname, "a");

  EXPECT_FALSE(parseTopologyJson(R"([{"hostname": "a", "rank": 1}])").isOk());
  EXPECT_FALSE(parseTopologyJson(R"({"ranks": 3})").isOk());
  auto badEntry = parseTopologyJson(R"([{"hostname": "a"}, {"host": "b"}])");
  ASSERT_FALSE(badEntry.isOk());
  EXPECT_NE(badEntry.status().message().find("rank 1"), std::string::npos);
}

TEST(Json, TopoFileReplacesDetection) {
  fs::path path = fs::temp_directory_path() / ("topo_test." + std::to_string(getpid()) + ".json");
  {
    nlohmann::ordered_json doc = nlohmann::ordered_json::array();
    for (const auto& r : twoByTwo({ibNic()})) doc.push_back(toJsonValue(r));
    std::ofstream(path) << doc.dump();
  }
  ScopedEnv e("BRAID_TOPO_FILE", path.c_str());
  auto config = loadConfig();
  ASSERT_TRUE(config.isOk()) << config.status().message();
  EXPECT_EQ(config->topoFile, path.string());
  auto local = localTopology(config.value(), 2, 4);
  ASSERT_TRUE(local.isOk()) << local.status().message();
  EXPECT_EQ(local.value(), twoByTwo({ibNic()})[2]);
  EXPECT_FALSE(localTopology(config.value(), 2, 3).isOk());
  fs::remove(path);
  auto missing = localTopology(config.value(), 0, 4);
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find(path.string()), std::string::npos);
}

// --- transport choice ---------------------------------------------------

TEST(Transports, ShmInsideHostsTcpBetween) {
  auto m = chooseTransports(twoByTwo(), kShmOnly);
  ASSERT_TRUE(m.isOk()) << m.status().message();
  EXPECT_EQ(transportGrid(m.value()),
            (std::vector<std::string>{"self shm tcp tcp", "shm self tcp tcp", "tcp tcp self shm",
                                      "tcp tcp shm self"}));
  EXPECT_EQ(m->at(0, 1).kind, LinkKind::kCrossNuma);
  EXPECT_EQ(m->at(2, 3).kind, LinkKind::kSameNuma);
  EXPECT_EQ(m->at(1, 2).kind, LinkKind::kNetwork);
  EXPECT_EQ(m->at(3, 3).kind, LinkKind::kSelf);
}

TEST(Transports, IbWhenBothHaveItAndItIsAvailable) {
  auto withIb = chooseTransports(twoByTwo({ibNic()}), kAll);
  ASSERT_TRUE(withIb.isOk()) << withIb.status().message();
  EXPECT_EQ(transportGrid(withIb.value())[0], "self shm ib ib");
  auto notBuilt = chooseTransports(twoByTwo({ibNic()}), kShmOnly);
  EXPECT_EQ(transportGrid(notBuilt.value())[0], "self shm tcp tcp");
  auto oneSided = twoByTwo({ibNic()});
  oneSided[3].devices.clear();
  auto m = chooseTransports(oneSided, kAll);
  EXPECT_EQ(transportGrid(m.value())[0], "self shm ib tcp");
  // A RoCE NIC is Ethernet with a verbs device.
  PciDevice roce = ethNic();
  roce.ibNames = {"mlx5_2"};
  EXPECT_EQ(transportGrid(chooseTransports(twoByTwo({roce}), kAll).value())[0], "self shm ib ib");
}

TEST(Transports, SoftRoceCountsAsAVerbsDeviceAndTravelsBetweenRanks) {
  // What detect() makes of Soft-RoCE's rxe0, which has no PCI function.
  PciDevice rxe;
  rxe.kind = DeviceKind::kInfiniband;
  rxe.busId = "virtual/rxe0";
  rxe.ibNames = {"rxe0"};
  auto ranks = twoByTwo({rxe});
  EXPECT_TRUE(ranks[0].hasIbDevice());
  auto back = RankTopology::decode(ranks[0].encode());
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->devices, ranks[0].devices);
  EXPECT_EQ(transportGrid(chooseTransports(ranks, kAll).value())[0], "self shm ib ib");
}

TEST(Transports, CudaIpcNeedsNvidiaGpusOnOneHostAndCuda) {
  auto ranks = twoByTwo({gpu()});
  EXPECT_EQ(transportGrid(chooseTransports(ranks, kAll).value())[0], "self cuda_ipc tcp tcp");
  EXPECT_EQ(transportGrid(chooseTransports(ranks, kShmOnly).value())[0], "self shm tcp tcp");
  ranks[1].transports.cudaIpc = false;  // rank 1 could not open a CUDA device
  EXPECT_EQ(transportGrid(chooseTransports(ranks, kAll).value())[0], "self shm tcp tcp");
  auto display = twoByTwo({gpu(0, 0x1a03)});  // a BMC's VGA function
  EXPECT_EQ(transportGrid(chooseTransports(display, kAll).value())[0], "self shm tcp tcp");
}

TEST(Transports, UnknownNumaIsSameHost) {
  std::vector<RankTopology> ranks = {rankOn("a", -1), rankOn("a", 0)};
  EXPECT_EQ(classify(ranks, 0, 1), LinkKind::kSameHost);
  EXPECT_EQ(chooseLink(ranks, 0, 1, kShmOnly).value().transport, Transport::kShm);
}

TEST(Transports, ForcedTcp) {
  auto m = chooseTransports(twoByTwo({gpu(), ibNic()}), kAll, "tcp");
  ASSERT_TRUE(m.isOk()) << m.status().message();
  EXPECT_EQ(transportGrid(m.value()),
            (std::vector<std::string>{"self tcp tcp tcp", "tcp self tcp tcp", "tcp tcp self tcp",
                                      "tcp tcp tcp self"}));
}

TEST(Transports, ForcedShmAcrossHostsIsAnErrorNamingThePair) {
  auto m = chooseTransports(twoByTwo(), kShmOnly, "shm");
  ASSERT_FALSE(m.isOk());
  EXPECT_EQ(m.status().code(), ErrorCode::kInvalidArgument);
  const std::string& why = m.status().message();
  EXPECT_NE(why.find("BRAID_TRANSPORT"), std::string::npos) << why;
  EXPECT_NE(why.find("ranks 0 and 2"), std::string::npos) << why;
  EXPECT_NE(why.find("one host"), std::string::npos) << why;
  // Within one host it is fine.
  std::vector<RankTopology> oneHost = {rankOn("a", 0), rankOn("a", 1)};
  EXPECT_TRUE(chooseTransports(oneHost, kShmOnly, "shm").isOk());
  // Not built: an error that says so.
  auto unavailable = chooseTransports(oneHost, TransportSet{false, false, false}, "shm");
  ASSERT_FALSE(unavailable.isOk());
  EXPECT_NE(unavailable.status().message().find("not available"), std::string::npos);
  auto noIb = chooseTransports(oneHost, kAll, "ib");
  ASSERT_FALSE(noIb.isOk());
  EXPECT_NE(noIb.status().message().find("InfiniBand"), std::string::npos);
}

TEST(Transports, UnknownNameListsTheKnownOnes) {
  for (int n : {1, 4}) {
    auto ranks = twoByTwo();
    ranks.resize(n);
    auto m = chooseTransports(ranks, kAll, "carrier-pigeon");
    ASSERT_FALSE(m.isOk());
    const std::string& why = m.status().message();
    EXPECT_NE(why.find("carrier-pigeon"), std::string::npos) << why;
    for (const char* name : {"cuda_ipc", "shm", "ib", "tcp"})
      EXPECT_NE(why.find(name), std::string::npos) << why;
  }
  EXPECT_FALSE(parseTransport("self").isOk());
}

TEST(Transports, SymmetricForAnyTopology) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    int n = 2 + static_cast<int>(rng() % 7);
    std::vector<RankTopology> ranks;
    for (int i = 0; i < n; ++i) {
      RankTopology r = rankOn(std::string(1, static_cast<char>('a' + rng() % 3)),
                              static_cast<int>(rng() % 3) - 1);
      if (rng() % 2) r.devices.push_back(gpu());
      if (rng() % 2) r.devices.push_back(ibNic());
      r.transports = {rng() % 4 != 0, rng() % 4 != 0, rng() % 4 != 0};
      ranks.push_back(r);
    }
    TransportSet available{rng() % 2 == 0, rng() % 2 == 0, rng() % 2 == 0};
    auto m = chooseTransports(ranks, available);
    ASSERT_TRUE(m.isOk()) << m.status().message();
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        EXPECT_EQ(m->at(a, b), m->at(b, a));
        // What rank a computes for its row is what rank b computes for its.
        EXPECT_EQ(chooseLink(ranks, a, b, available).value(),
                  chooseLink(ranks, b, a, available).value());
        EXPECT_EQ(m->at(a, b), chooseLink(ranks, a, b, available).value());
      }
  }
}

TEST(Transports, MatrixPrints) {
  auto m = chooseTransports(twoByTwo(), kShmOnly);
  ASSERT_TRUE(m.isOk());
  std::string text = m->toText();
  EXPECT_NE(text.find("shm"), std::string::npos) << text;
  EXPECT_NE(text.find("cross-numa"), std::string::npos) << text;
  EXPECT_NE(text.find("pairs: shm 2 tcp 4"), std::string::npos) << text;
  auto json = nlohmann::json::parse(m->toJson());
  ASSERT_EQ(json["transport"].size(), 4u);
  EXPECT_EQ(json["transport"][0][2], "tcp");
  EXPECT_EQ(json["link"][2][3], "same-numa");
  // Past 16 ranks, one letter per cell.
  std::vector<RankTopology> many(20, rankOn("a", 0));
  std::string compact = chooseTransports(many, kShmOnly).value().toText();
  EXPECT_NE(compact.find("\n 0  .  s  s"), std::string::npos) << compact;
}

}  // namespace
}  // namespace braid::topo
