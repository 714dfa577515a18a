// Runs the real braid-topo, alone and under braidrun, and checks its JSON.
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tool_process.h"

namespace {

namespace fs = std::filesystem;
using namespace tool_process;
using nlohmann::json;

std::string topo() {
  return quote(toolPath("BRAIDTOPO", "braid-topo"));
}

std::string underBraidrun(int ranks, const std::string& args) {
  return quote(toolPath("BRAIDRUN", "braidrun")) + " -n " + std::to_string(ranks) + " " + topo() +
         " " + args;
}

// Only rank 0 prints; braidrun prefixes its lines with "[0] ".
json rankZeroJson(const Outcome& outcome) {
  std::istringstream in(outcome.out);
  std::string text;
  for (std::string line; std::getline(in, line);) {
    EXPECT_EQ(line.rfind("[0] ", 0), 0u) << "line not from rank 0: " << line;
    text += line.substr(std::min<size_t>(4, line.size())) + "\n";
  }
  json doc = json::parse(text, nullptr, false);
  EXPECT_FALSE(doc.is_discarded()) << text;
  return doc;
}

std::string hostname() {
  char host[HOST_NAME_MAX + 1] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

class TopoFile {
 public:
  explicit TopoFile(const std::string& text)
      : path_(fs::temp_directory_path() / ("braid_topo_test." + std::to_string(getpid()) + "." +
                                           std::to_string(counter_++) + ".json")) {
    std::ofstream(path_) << text;
  }
  ~TopoFile() { fs::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// Ranks 0 and 1 on host a, rank 2 on host b.
constexpr const char* kTwoHosts = R"([
  {"hostname": "a", "numa_node": 0, "cores": "0-7"},
  {"hostname": "a", "numa_node": 1, "cores": "8-15"},
  {"hostname": "b", "numa_node": 0, "cores": "0-7"}
])";

TEST(BraidTopo, ThreeRanksUnderBraidrun) {
  Outcome outcome = run(underBraidrun(3, "--json --available shm"));
  ASSERT_EQ(outcome.exitCode, 0) << outcome.err;
  json doc = rankZeroJson(outcome);
  EXPECT_EQ(doc["source"], "detected");
  ASSERT_EQ(doc["ranks"].size(), 3u) << doc.dump(2);
  std::set<int> pids;
  for (int r = 0; r < 3; ++r) {
    const json& rank = doc["ranks"][r];
    EXPECT_EQ(rank["rank"], r);
    EXPECT_EQ(rank["hostname"], hostname());
    EXPECT_EQ(rank["host_id"], doc["ranks"][0]["host_id"]);
    EXPECT_NE(rank["cores"], "");
    EXPECT_GT(rank["pid"].get<int>(), 0);
    pids.insert(rank["pid"].get<int>());
  }
  EXPECT_EQ(pids.size(), 3u) << "three processes";
  const json& matrix = doc["matrix"];
  ASSERT_EQ(matrix["transport"].size(), 3u) << doc.dump(2);
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) {
      EXPECT_EQ(matrix["transport"][a][b], a == b ? "self" : "shm") << a << "," << b;
      std::string kind = matrix["link"][a][b];
      if (a == b) {
        EXPECT_EQ(kind, "self");
      } else {
        EXPECT_TRUE(kind == "same-numa" || kind == "cross-numa" || kind == "same-host") << kind;
      }
    }
}

TEST(BraidTopo, TopoFileUnderBraidrun) {
  TopoFile file(kTwoHosts);
  Outcome outcome = run("BRAID_TOPO_FILE=" + quote(file.path()) + " " +
                        underBraidrun(3, "--json --available shm"));
  ASSERT_EQ(outcome.exitCode, 0) << outcome.err;
  json doc = rankZeroJson(outcome);
  ASSERT_EQ(doc["ranks"].size(), 3u);
  EXPECT_EQ(doc["ranks"][2]["hostname"], "b");
  EXPECT_EQ(doc["matrix"]["transport"],
            json::parse(R"([["self","shm","tcp"],["shm","self","tcp"],["tcp","tcp","self"]])"));
  EXPECT_EQ(doc["matrix"]["link"][0][1], "cross-numa");
  EXPECT_EQ(doc["matrix"]["link"][1][2], "network");
}

TEST(BraidTopo, ForcedShmAcrossHostsFails) {
  TopoFile file(kTwoHosts);
  Outcome outcome =
      run(underBraidrun(3, "--json --available shm --transport shm --file " + quote(file.path())));
  EXPECT_NE(outcome.exitCode, 0);
  EXPECT_NE(outcome.err.find("ranks 0 and 2"), std::string::npos) << outcome.err;
  json doc = rankZeroJson(outcome);
  EXPECT_TRUE(doc["matrix"].is_null());
  EXPECT_NE(doc["error"].get<std::string>().find("one host"), std::string::npos);
}

TEST(BraidTopo, Standalone) {
  Outcome self = run(topo() + " --json");
  ASSERT_EQ(self.exitCode, 0) << self.err;
  json doc = json::parse(self.out);
  ASSERT_EQ(doc["ranks"].size(), 1u);
  EXPECT_EQ(doc["ranks"][0]["hostname"], hostname());
  EXPECT_EQ(doc["matrix"]["transport"][0][0], "self");
  // What this process sees of RDMA: devices, or the reason there are none.
  ASSERT_TRUE(doc["rdma"].is_object()) << self.out;
  if (!doc["rdma"]["available"].get<bool>())
    EXPECT_FALSE(doc["rdma"]["reason"].get<std::string>().empty());
  else
    EXPECT_FALSE(doc["rdma"]["devices"].empty());

  TopoFile file(kTwoHosts);
  Outcome fromFile = run(topo() + " --json --available shm --file " + quote(file.path()));
  ASSERT_EQ(fromFile.exitCode, 0) << fromFile.err;
  json all = json::parse(fromFile.out);
  EXPECT_EQ(all["ranks"].size(), 3u);
  EXPECT_EQ(all["matrix"]["transport"][0][2], "tcp");

  // Its own JSON output is a valid topology file.
  TopoFile again(fromFile.out);
  Outcome replay = run(topo() + " --json --available shm --file " + quote(again.path()));
  ASSERT_EQ(replay.exitCode, 0) << replay.err;
  EXPECT_EQ(json::parse(replay.out)["matrix"], all["matrix"]);

  Outcome text = run(topo() + " --available shm --file " + quote(file.path()));
  ASSERT_EQ(text.exitCode, 0) << text.err;
  EXPECT_NE(text.out.find("transport (row: rank a, column: rank b)"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("pairs: shm 1 tcp 2"), std::string::npos) << text.out;
}

// Two processes on one GPU, as on a one-GPU machine: both list it, with the
// UUID that names it, in the text and in the JSON.
TEST(BraidTopo, ShowsGpusWithTheirUuid) {
  TopoFile file(R"([
    {"hostname": "g", "numa_node": 0, "cores": "0-7", "devices": [{"kind": "gpu",
     "bus_id": "0000:3b:00.0", "vendor": "0x10de", "device": "0x2330", "numa_node": 0,
     "uuid": "GPU-0c2f9d3e-51a7-4b1e-9d0a-7e3f2b6c8a41"}]},
    {"hostname": "g", "numa_node": 0, "cores": "0-7", "devices": [{"kind": "gpu",
     "bus_id": "0000:3b:00.0", "vendor": "0x10de", "device": "0x2330", "numa_node": 0,
     "uuid": "GPU-0c2f9d3e-51a7-4b1e-9d0a-7e3f2b6c8a41"}]}
  ])");
  Outcome text = run(topo() + " --available shm --file " + quote(file.path()));
  ASSERT_EQ(text.exitCode, 0) << text.err;
  EXPECT_NE(text.out.find(
                "gpu  0000:3b:00.0  10de:2330  NUMA 0  GPU-0c2f9d3e-51a7-4b1e-9d0a-7e3f2b6c8a41"),
            std::string::npos)
      << text.out;
  Outcome asJson = run(topo() + " --json --available shm --file " + quote(file.path()));
  ASSERT_EQ(asJson.exitCode, 0) << asJson.err;
  json doc = json::parse(asJson.out);
  EXPECT_EQ(doc["ranks"][1]["devices"][0]["uuid"], "GPU-0c2f9d3e-51a7-4b1e-9d0a-7e3f2b6c8a41");
}

// The room of /dev/shm and the rings braid fits to it (BRAID_SHM_BYTES
// auto), for the ranks of rank 0's host: in a 24 MiB tmpfs of a mount
// namespace of the test's own, 1 MiB rings hold 3 ranks (half the room,
// 2 MiB a pair) and 6 ranks get 256 KiB rings.
TEST(BraidTopo, ShowsTheRoomOfDevShmAndTheRingsThatFit) {
  Outcome alone = run(topo());
  ASSERT_EQ(alone.exitCode, 0) << alone.err;
  EXPECT_NE(alone.out.find("shared memory: /dev/shm has "), std::string::npos) << alone.out;
  Outcome given = run("env BRAID_SHM_BYTES=65536 " + topo() + " --json");
  ASSERT_EQ(given.exitCode, 0) << given.err;
  json doc = json::parse(given.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << given.out;
  EXPECT_EQ(doc["shm"]["ring_bytes"], 65536) << doc.dump(2);
  EXPECT_EQ(doc["shm"]["auto"], false) << doc.dump(2);
  EXPECT_GT(doc["shm"]["free_bytes"].get<double>(), 0) << doc.dump(2);

  if (run("unshare -m true").exitCode != 0)
    GTEST_SKIP() << "cannot make a mount namespace here (unshare -m: needs root or "
                    "CAP_SYS_ADMIN), so no small /dev/shm to show";
  const std::string smallShm = "unshare -m sh -c 'mount -t tmpfs -o size=24m tmpfs /dev/shm && ";
  Outcome one = run(smallShm + topo() + "'");
  ASSERT_EQ(one.exitCode, 0) << one.err;
  EXPECT_NE(one.out.find("shared memory: /dev/shm has 24 MiB free; 1 MiB rings for up to 3 ranks "
                         "a host"),
            std::string::npos)
      << one.out;
  Outcome six = run(smallShm + underBraidrun(6, "") + "'");
  ASSERT_EQ(six.exitCode, 0) << six.err;
  EXPECT_NE(six.out.find("rings of 262144 bytes for the 6 ranks of rank 0's host"),
            std::string::npos)
      << six.out;
}

TEST(BraidTopo, BadUsage) {
  EXPECT_EQ(run(topo() + " --bogus").exitCode, 2);
  Outcome unknown = run(topo() + " --available carrier-pigeon");
  EXPECT_EQ(unknown.exitCode, 2);
  EXPECT_NE(unknown.err.find("cuda_ipc, shm, ib, tcp"), std::string::npos) << unknown.err;
  Outcome missing = run(topo() + " --file /nonexistent/topo.json");
  EXPECT_EQ(missing.exitCode, 1);
  EXPECT_NE(missing.err.find("/nonexistent/topo.json"), std::string::npos) << missing.err;
}

}  // namespace
