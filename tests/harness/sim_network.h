// Runs the Schedules of P virtual ranks inside one process over in-memory
// message queues: the algorithms' correctness, checked without sockets.
// Matching follows the schedule contract: the k-th Send from a to b is the
// k-th Recv from a in b's schedule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "src/common/datatype.h"

namespace braid::sim {

struct RankMemory {
  std::vector<uint8_t> send, recv, scratch;
  // In-place calls: the Send buffer lives inside recv at this byte offset,
  // or the Recv buffer inside send (-1 = separate buffers).
  long sendInRecv = -1, recvInSend = -1;
};

// How a send completes. kBuffered: once its bytes are taken, whether or not
// the receive is posted (a transport with buffers of its own). kRendezvous:
// only once the peer has started the matching receive (a transport whose
// receiver reads the sender's buffer in place, cuda_ipc's direct reads), so
// a schedule whose receives wait for sends that wait for those receives
// deadlocks.
enum class Delivery { kBuffered, kRendezvous };

// Executes every rank's schedule; returns "" on success, else what went
// wrong (a message size mismatch, a deadlock, a malformed schedule).
std::string run(const std::vector<algo::Schedule>& plans, std::vector<RankMemory>& memory,
                DataType dtype, RedOp op, Delivery delivery = Delivery::kBuffered);

// Two steps of one rank that no chain of dependencies orders, one writing
// bytes the other reads or writes: a race on real transports, whatever the
// simulator's order happened to be. Returns "" or the first such pair.
// Quadratic in the schedule's steps: for schedules up to a few thousand.
std::string findRaces(const algo::Schedule& plan, const RankMemory& layout);

}  // namespace braid::sim
