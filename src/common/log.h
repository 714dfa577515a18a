// The one logger. Level from BRAID_DEBUG (WARN, INFO, TRACE; default WARN);
// every line goes to stderr as "braid <host>:<pid> <LEVEL> <message>".
#pragma once

#include <string_view>

#include "src/common/strcat.h"

namespace braid::log {

enum class Level : int { kWarn = 0, kInfo = 1, kTrace = 2 };

// The active level. It is read from BRAID_DEBUG on first use; a malformed
// value falls back to WARN here and is reported as an error by the config
// validation at communicator init.
Level level();
void setLevel(Level level);
void write(Level level, std::string_view message);

inline bool enabled(Level l) {
  return static_cast<int>(l) <= static_cast<int>(level());
}

}  // namespace braid::log

#define BRAID_LOG(lvl, ...)                                                        \
  do {                                                                             \
    if (::braid::log::enabled(::braid::log::Level::lvl))                           \
      ::braid::log::write(::braid::log::Level::lvl, ::braid::strCat(__VA_ARGS__)); \
  } while (0)
#define BRAID_WARN(...) BRAID_LOG(kWarn, __VA_ARGS__)
#define BRAID_INFO(...) BRAID_LOG(kInfo, __VA_ARGS__)
#define BRAID_TRACE(...) BRAID_LOG(kTrace, __VA_ARGS__)
