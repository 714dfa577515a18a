// Runs the real braid-sim: every collective at 4096 ranks, its marked
// choice against its own predictions, the out-of-cache figures, and bad
// arguments.
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tool_process.h"

namespace {

using namespace tool_process;

struct Row {
  std::string collective, size, algorithm;
  int ranks = 0;
  double microseconds = 0;
  bool chosen = false;
};

std::vector<Row> rows(const std::string& out) {
  std::vector<Row> parsed;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    Row row;
    std::string next;
    words >> row.collective >> row.ranks >> row.size >> row.algorithm >> next;
    row.chosen = next == "*";
    if (row.chosen) words >> next;
    row.microseconds = std::stod(next);
    parsed.push_back(row);
  }
  return parsed;
}

Outcome sim(const std::string& args) {
  return run(quote(toolPath("BRAIDSIM", "braid-sim")) + " " + args);
}

// The choice of every (collective, world, size), by name.
std::map<std::string, std::string> choices(const std::vector<Row>& table) {
  std::map<std::string, std::string> chosen;
  for (const Row& r : table)
    if (r.chosen) chosen[r.collective + " " + std::to_string(r.ranks) + " " + r.size] = r.algorithm;
  return chosen;
}

TEST(BraidSim, EveryCollectiveAtFourThousandRanksWithItsSchedules) {
  Outcome o = sim("-P 4096 -c all --sizes 8,1M,64M --plan");
  ASSERT_EQ(o.exitCode, 0) << o.err;
  const std::vector<Row> table = rows(o.out);
  // 9 collectives at 3 sizes, each with exactly one choice.
  std::map<std::string, int> marks;
  for (const Row& r : table) {
    EXPECT_EQ(r.ranks, 4096);
    EXPECT_GE(r.microseconds, 0) << r.collective << " " << r.algorithm;
    marks[r.collective + " " + r.size] += r.chosen ? 1 : 0;
  }
  EXPECT_EQ(marks.size(), 27u);
  for (const auto& [group, count] : marks) EXPECT_EQ(count, 1) << group;
}

TEST(BraidSim, TheChoiceIsTheLowestPrediction) {
  Outcome o = sim("-P 2,3,8,64,1024 --sizes 8,64K,1M,16M");
  ASSERT_EQ(o.exitCode, 0) << o.err;
  std::map<std::string, std::vector<Row>> groups;
  for (const Row& r : rows(o.out)) groups[std::to_string(r.ranks) + " " + r.size].push_back(r);
  ASSERT_EQ(groups.size(), 20u);
  for (const auto& [group, table] : groups) {
    double lowest = 1e300, chosen = -1;
    for (const Row& r : table) {
      lowest = std::min(lowest, r.microseconds);
      if (r.chosen) chosen = r.microseconds;
    }
    // The printed figures are rounded to 0.1 us; ties go to fewer rounds.
    EXPECT_LE(chosen, lowest + 0.1) << group;
  }
}

// 3 ranks on 2 cores with the figures of a communicator's INFO lines: the
// out-of-cache ones move the choice to the ring from 4 MiB per rank, and
// leave smaller sizes as they were.
TEST(BraidSim, OutOfCacheFiguresMoveTheChoiceOnlyBeyondTheCaches) {
  const std::string host =
      "-P 3 --sizes 64K,1M,4M,16M --alpha-us 2.1 --gbps 6.5 --reduce-gbps 11.8 --cores 2 "
      "--contention 2.9";
  Outcome cached = sim(host);
  Outcome both = sim(host + " --uncached-gbps 3 --uncached-contention 2.2");
  ASSERT_EQ(cached.exitCode, 0) << cached.err;
  ASSERT_EQ(both.exitCode, 0) << both.err;
  auto before = choices(rows(cached.out)), after = choices(rows(both.out));
  EXPECT_EQ(before["allreduce 3 4M"], "halving");
  EXPECT_EQ(after["allreduce 3 4M"], "ring");
  EXPECT_EQ(after["allreduce 3 16M"], "ring");
  EXPECT_EQ(after["allreduce 3 64K"], before["allreduce 3 64K"]);
  EXPECT_EQ(after["allreduce 3 1M"], before["allreduce 3 1M"]);
  EXPECT_NE(both.out.find("out of cache (from 4 MiB per rank): link 3 GB/s"), std::string::npos)
      << both.out;
}

TEST(BraidSim, BadArgumentsAreErrorsNamingTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--gbps 0", "--gbps"},
      {"--alpha-us -1", "--alpha-us"},
      {"--reduce-gbps 0", "--reduce-gbps"},
      {"--contention 0.5", "--contention"},
      {"--uncached-contention 2", "--uncached-gbps"},
      {"--uncached-gbps -1", "--uncached-gbps"},
      {"-P 0", "world size"},
      {"-c gossip", "gossip"},
      {"--sizes 1Q", "1Q"},
  };
  for (const auto& [args, named] : cases) {
    Outcome o = sim(args);
    EXPECT_EQ(o.exitCode, 2) << args;
    EXPECT_NE(o.err.find(named), std::string::npos) << args << ": " << o.err;
    EXPECT_TRUE(o.out.empty() || o.out[0] == '#') << args;
  }
}

}  // namespace
