// perf_options.h: nccl-tests' flags as the perf tests read them.
#include "perf/perf_options.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace braid::perf {
namespace {

const Collective kNothing{"test_perf", nullptr, false,   false,   true,   false,
                          nullptr,     nullptr, nullptr, nullptr, nullptr};

Options parse(std::vector<std::string> words) {
  words.insert(words.begin(), "test_perf");
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return parseOptions(static_cast<int>(argv.size()), argv.data(), kNothing);
}

// As nccl-tests reads them (a number, then K, M or G, the number with a
// fraction or the suffix after a space too).
TEST(PerfOptions, SizesMayHaveAFraction) {
  EXPECT_EQ(parse({"-b", "0.5M", "-e", "1M", "-f", "2"}).sweep,
            (std::vector<size_t>{524288, 1048576}));
  EXPECT_EQ(parse({"-b", "1.5K", "-e", "1.5K"}).sweep, (std::vector<size_t>{1536}));
  EXPECT_EQ(parse({"-b", "32 M", "-e", "32M"}).sweep, (std::vector<size_t>{size_t{32} << 20}));
  EXPECT_EQ(parse({"-b", "8", "-e", "64", "-f", "2"}).sweep, (std::vector<size_t>{8, 16, 32, 64}));
  for (const char* bad : {"1X", "-1", "0.5.5M", "M", "", "1MM", "1e3"})
    EXPECT_THROW(parse({"-b", bad, "-e", "1G"}), std::invalid_argument) << bad;
}

// A multiplicative step that wraps past 2^64 ends the sweep; it went on in
// steps of one byte (2^30 sizes built before the first call).
TEST(PerfOptions, AStepFactorThatOverflowsEndsTheSweep) {
  const Options o = parse({"-b", "16G", "-e", "17G", "-f", "1073741824"});
  EXPECT_EQ(o.sweep, (std::vector<size_t>{size_t{16} << 30}));
}

// A sweep of more sizes than anyone runs is refused with the reason, rather
// than built (8 bytes a size) and run for days.
TEST(PerfOptions, ASweepOfMillionsOfSizesIsRefused) {
  EXPECT_THROW(parse({"-b", "1", "-e", "1G", "-i", "1"}), std::invalid_argument);
  EXPECT_EQ(parse({"-b", "1K", "-e", "1M", "-i", "1K"}).sweep.size(), 1024u);
}

// Timed calls beyond what an int holds are refused; their product divided
// the time as an overflowed int.
TEST(PerfOptions, TimedCallsBeyondAnIntAreRefused) {
  EXPECT_THROW(parse({"-n", "100000", "-m", "30000"}), std::invalid_argument);
  EXPECT_NO_THROW(parse({"-n", "1000", "-m", "1000"}));
}

// nccl-tests' -z 2/3 and -R 2 (symmetric registration) name modes braid
// does not have: refused, not run as -z 1 or -R 1 under the other name.
TEST(PerfOptions, ModesOfNcclTestsBraidLacksAreRefused) {
  for (std::vector<std::string> bad : {std::vector<std::string>{"-z", "2"},
                                       {"-z", "3"},
                                       {"-z", "-1"},
                                       {"-R", "2"},
                                       {"-R", "-1"},
                                       {"-A", "2"}})
    EXPECT_THROW(parse(bad), std::invalid_argument) << bad[0] << " " << bad[1];
  EXPECT_EQ(parse({"-z", "0"}).blocking, 0);
  EXPECT_TRUE(parse({"-R", "1"}).localRegister);
}

// A results file that cannot be written is refused before the sweep, not
// found out after hours of it.
TEST(PerfOptions, AJsonPathInADirectoryThatIsNotThereIsRefused) {
  EXPECT_THROW(parse({"-J", "/nonexistent-directory/results.json"}), std::invalid_argument);
  EXPECT_EQ(parse({"-J", "results.json"}).jsonPath, "results.json");
}

}  // namespace
}  // namespace braid::perf
