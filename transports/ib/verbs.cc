#include "transports/ib/verbs.h"

#include <cstdio>

#include "src/common/strcat.h"

namespace braid::ib {

int mtuBytes(Mtu mtu) {
  return 128 << static_cast<int>(mtu);
}

bool Gid::isZero() const {
  for (uint8_t b : raw)
    if (b != 0) return false;
  return true;
}

std::string toString(const Gid& gid) {
  std::string out;
  char group[6];
  for (size_t i = 0; i < gid.raw.size(); i += 2) {
    std::snprintf(group, sizeof(group), "%s%02x%02x", i == 0 ? "" : ":", gid.raw[i],
                  gid.raw[i + 1]);
    out += group;
  }
  return out;
}

const char* completionStatusName(CompletionStatus status) {
  switch (status) {
    case CompletionStatus::kSuccess:
      return "success";
    case CompletionStatus::kLocalLengthError:
      return "local length error";
    case CompletionStatus::kLocalQpOperationError:
      return "local QP operation error";
    case CompletionStatus::kLocalEecOperationError:
      return "local EE context operation error";
    case CompletionStatus::kLocalProtectionError:
      return "local protection error";
    case CompletionStatus::kWorkRequestFlushError:
      return "Work Request Flushed Error";
    case CompletionStatus::kMemoryWindowBindError:
      return "memory management operation error";
    case CompletionStatus::kBadResponseError:
      return "bad response error";
    case CompletionStatus::kLocalAccessError:
      return "local access error";
    case CompletionStatus::kRemoteInvalidRequestError:
      return "remote invalid request error";
    case CompletionStatus::kRemoteAccessError:
      return "remote access error";
    case CompletionStatus::kRemoteOperationError:
      return "remote operation error";
    case CompletionStatus::kRetryExceeded:
      return "transport retry counter exceeded";
    case CompletionStatus::kRnrRetryExceeded:
      return "RNR retry counter exceeded";
    case CompletionStatus::kLocalRddViolationError:
      return "local RDD violation error";
    case CompletionStatus::kRemoteInvalidRdRequest:
      return "remote invalid RD request";
    case CompletionStatus::kRemoteAbortError:
      return "aborted error";
    case CompletionStatus::kInvalidEecn:
      return "invalid EE context number";
    case CompletionStatus::kInvalidEecState:
      return "invalid EE context state";
    case CompletionStatus::kFatalError:
      return "fatal error";
    case CompletionStatus::kResponseTimeoutError:
      return "response timeout error";
    case CompletionStatus::kGeneralError:
      return "general error";
  }
  // Newer libibverbs has statuses past these (tag matching); they are not
  // named here because braid never posts what produces them.
  return "unknown";
}

const char* queuePairStateName(QueuePairState state) {
  switch (state) {
    case QueuePairState::kReset:
      return "RESET";
    case QueuePairState::kInit:
      return "INIT";
    case QueuePairState::kReadyToReceive:
      return "RTR";
    case QueuePairState::kReadyToSend:
      return "RTS";
    case QueuePairState::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

Status refuseTransition(uint32_t qpn, QueuePairState from, QueuePairState to) {
  return invalidUsage(strCat("queue pair ", qpn, ": ", queuePairStateName(from), " -> ",
                             queuePairStateName(to),
                             " refused (a queue pair moves RESET -> INIT -> RTR -> RTS)"));
}

}  // namespace braid::ib
