// Runs a command-line tool as a user would and captures what it says.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace tool_process {

namespace fs = std::filesystem;

// The tool's path: from `variable`, set by the build's test definition (not
// BRAID_*: braid rejects names it does not know), else next to the test in
// the build tree, for runs by hand.
inline std::string toolPath(const char* variable, const char* name) {
  if (const char* path = std::getenv(variable); path != nullptr && *path != '\0') return path;
  return (fs::read_symlink("/proc/self/exe").parent_path() / "../../tools" / name).string();
}

inline std::string quote(const std::string& word) {
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Outcome {
  int exitCode = -1;
  std::string out;
  std::string err;
};

inline Outcome run(const std::string& command) {
  fs::path errPath =
      fs::temp_directory_path() / ("braid_tool_test." + std::to_string(getpid()) + ".err");
  Outcome outcome;
  FILE* pipe = popen((command + " 2>" + quote(errPath.string())).c_str(), "r");
  if (pipe == nullptr) return outcome;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) outcome.out.append(buf, n);
  int status = pclose(pipe);
  if (WIFEXITED(status)) outcome.exitCode = WEXITSTATUS(status);
  std::ifstream err(errPath);
  std::stringstream text;
  text << err.rdbuf();
  outcome.err = text.str();
  fs::remove(errPath);
  return outcome;
}

}  // namespace tool_process
