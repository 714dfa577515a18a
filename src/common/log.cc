#include "src/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace braid::log {
namespace {

Level parseLevel(const char* text) {
  if (text == nullptr) return Level::kWarn;
  if (strcasecmp(text, "INFO") == 0) return Level::kInfo;
  if (strcasecmp(text, "TRACE") == 0) return Level::kTrace;
  return Level::kWarn;
}

std::atomic<int>& levelStorage() {
  static std::atomic<int> value{static_cast<int>(parseLevel(std::getenv("BRAID_DEBUG")))};
  return value;
}

const char* levelName(Level l) {
  switch (l) {
    case Level::kWarn:
      return "WARN";
    case Level::kInfo:
      return "INFO";
    case Level::kTrace:
      return "TRACE";
  }
  return "?";
}

}  // namespace

Level level() {
  return static_cast<Level>(levelStorage().load(std::memory_order_relaxed));
}
void setLevel(Level l) {
  levelStorage().store(static_cast<int>(l));
}

void write(Level l, std::string_view message) {
  char host[64] = "?";
  gethostname(host, sizeof(host) - 1);
  std::string line = strCat("braid ", host, ":", getpid(), " ", levelName(l), " ", message, "\n");
  // One write(2) per line keeps lines of concurrent ranks and threads whole.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace braid::log
