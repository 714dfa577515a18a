#include "src/common/status.h"

#include <cstring>

namespace braid {

Status errnoStatus(const std::string& what, int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* text = strerror_r(err, buf, sizeof(buf));
  return Status(ErrorCode::kSystemError, what + ": " + text);
}

}  // namespace braid
