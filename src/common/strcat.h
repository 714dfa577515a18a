// strCat(a, b, ...): builds a string from anything with operator<<. Used by
// error messages and the logger (the toolchain's library has no std::format).
#pragma once

#include <sstream>
#include <string>

namespace braid {

template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace braid
