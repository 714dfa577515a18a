#include "src/agreed_settings.h"

#include <map>
#include <utility>
#include <vector>

#include "src/common/strcat.h"

namespace braid {
namespace {

constexpr char kSeparator = '\x1f';

std::string numberOrMeasured(double value) {
  return value > 0 ? strCat(value) : std::string("measured");
}

std::vector<std::pair<std::string, std::string>> entriesOf(const std::string& line) {
  std::vector<std::pair<std::string, std::string>> entries;
  size_t begin = 0;
  while (begin < line.size()) {
    size_t end = line.find(kSeparator, begin);
    if (end == std::string::npos) end = line.size();
    const std::string entry = line.substr(begin, end - begin);
    const size_t equals = entry.find('=');
    if (equals != std::string::npos)
      entries.emplace_back(entry.substr(0, equals), entry.substr(equals + 1));
    begin = end + 1;
  }
  return entries;
}

}  // namespace

std::string agreedSettings(const Config& config) {
  std::string algo;
  for (const auto& [collective, algorithm] : config.algo)
    algo += strCat(algo.empty() ? "" : ",", collective, "=", algorithm);
  const std::pair<const char*, std::string> entries[] = {
      {"BRAID_CHUNK_BYTES", strCat(config.chunkBytes)},
      {"BRAID_ALGO", algo.empty() ? std::string("(unset)") : algo},
      {"BRAID_TUNE", config.tune == Config::Tune::kMeasure ? "measure" : "model"},
      {"BRAID_TRANSPORT", config.transport.empty() ? std::string("(automatic)") : config.transport},
      {"BRAID_SHM_BOARD", config.shmBoard ? "1" : "0"},
      {"BRAID_SHM_BOARD_BYTES", strCat(config.shmBoardBytes)},
      {"BRAID_CUDA_IPC", config.cudaIpc ? "1" : "0"},
      {"BRAID_GPU_STAGING", config.gpuStagingPipelined ? "pipelined" : "whole"},
      // The size it comes to: auto and 32M are alike.
      {"BRAID_CUDA_IPC_SLOT_BYTES",
       strCat(config.cudaIpcSlotBytes > 0 ? config.cudaIpcSlotBytes : kDefaultCudaIpcSlotBytes)},
      {"BRAID_LINK_ALPHA_US", numberOrMeasured(config.linkAlphaMicroseconds)},
      {"BRAID_LINK_GBPS", numberOrMeasured(config.linkGigabytesPerSecond)},
      {"BRAID_REDUCE_GBPS", numberOrMeasured(config.reduceGigabytesPerSecond)},
      {"BRAID_FIRST_CALL_NUMBER", strCat(config.firstCallNumber)},
  };
  std::string line;
  for (const auto& [name, value] : entries) {
    std::string clean = value;
    // The line travels as one line of the rank's card (src/bootstrap.h).
    for (char& c : clean)
      if (c == '\n' || c == kSeparator) c = ' ';
    line += strCat(line.empty() ? "" : std::string(1, kSeparator), name, "=", clean);
  }
  // Alike settings still make alike lines when cut.
  if (line.size() > kMaxAgreedSettingsBytes) line.resize(kMaxAgreedSettingsBytes);
  return line;
}

Status checkAgreedSettings(std::span<const std::string> published) {
  if (published.empty()) return Status::ok();
  const auto first = entriesOf(published[0]);
  std::map<std::string, std::string> reference(first.begin(), first.end());
  for (size_t rank = 1; rank < published.size(); ++rank) {
    const auto entries = entriesOf(published[rank]);
    if (entries.size() != first.size())
      return invalidUsage(strCat("rank ", rank, " published other settings than rank 0 (",
                                 entries.size(), " against ", first.size(),
                                 "): are the ranks running different builds of braid?"));
    for (const auto& [name, value] : entries) {
      auto it = reference.find(name);
      if (it == reference.end())
        return invalidUsage(strCat("rank ", rank, " published a setting rank 0 did not, ", name,
                                   ": are the ranks running different builds of braid?"));
      if (it->second != value)
        return invalidUsage(strCat(name, " is ", value, " on rank ", rank, " but ", it->second,
                                   " on rank 0: every rank of a communicator must set it alike "
                                   "(docs/ENVIRONMENT.md)"));
    }
  }
  return Status::ok();
}

}  // namespace braid
