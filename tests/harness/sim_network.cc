#include "tests/harness/sim_network.h"

#include <cstring>
#include <map>
#include <unordered_map>

#include "src/common/reduce.h"
#include "src/common/strcat.h"

namespace braid::sim {

using algo::BufferId;
using algo::Slice;
using algo::StepKind;

namespace {

struct RankState {
  std::vector<int> waiting;     // unfinished predecessors per step
  std::vector<uint32_t> index;  // k of each Send/Recv
  std::vector<std::vector<int>> dependents;
  std::vector<int> ready;
  // Like the engine, sends to one peer go out in schedule order: a ready
  // send waits here until every earlier send to that peer has gone.
  std::unordered_map<int, uint32_t> nextSend;
  std::unordered_map<int, std::map<uint32_t, int>> heldSends;
  size_t remaining = 0;
};

uint8_t* at(RankMemory& m, const Slice& s) {
  if (s.buffer == BufferId::kSend && m.sendInRecv >= 0)
    return m.recv.data() + m.sendInRecv + s.offset;
  if (s.buffer == BufferId::kRecv && m.recvInSend >= 0)
    return m.send.data() + m.recvInSend + s.offset;
  std::vector<uint8_t>& v = s.buffer == BufferId::kSend   ? m.send
                            : s.buffer == BufferId::kRecv ? m.recv
                                                          : m.scratch;
  return v.data() + s.offset;
}

// (from, to, k) packed: the identity of one message.
uint64_t messageKey(int from, int to, uint32_t k) {
  return (static_cast<uint64_t>(from) << 44) | (static_cast<uint64_t>(to) << 24) | k;
}

}  // namespace

// Event driven: a send lands in a mailbox or completes the receive already
// waiting for it; a receive takes its message or waits for it. Every step
// is handled once, so thousands of ranks simulate in seconds.
std::string run(const std::vector<algo::Schedule>& plans, std::vector<RankMemory>& memory,
                DataType dtype, RedOp op) {
  const int P = static_cast<int>(plans.size());
  const size_t es = dataTypeSize(dtype);
  std::vector<RankState> state(P);
  for (int r = 0; r < P; ++r) {
    const auto& steps = plans[r].steps;
    memory[r].scratch.assign(plans[r].scratchBytes, 0xAB);
    RankState& st = state[r];
    st.waiting.assign(steps.size(), 0);
    st.index.assign(steps.size(), 0);
    st.dependents.assign(steps.size(), {});
    st.remaining = steps.size();
    std::unordered_map<int, uint32_t> sends, recvs;
    for (size_t i = 0; i < steps.size(); ++i) {
      for (auto d : steps[i].after)
        if (d != algo::kNoStep) {
          if (d < 0 || static_cast<size_t>(d) >= i)
            return strCat("rank ", r, " step ", i, " waits for a later step");
          ++st.waiting[i];
          st.dependents[d].push_back(static_cast<int>(i));
        }
      if (steps[i].kind == StepKind::kSend || steps[i].kind == StepKind::kRecv) {
        if (steps[i].peer < 0 || steps[i].peer >= P)
          return strCat("rank ", r, " step ", i, " talks to rank ", steps[i].peer);
        st.index[i] = (steps[i].kind == StepKind::kSend ? sends : recvs)[steps[i].peer]++;
      }
      if (st.waiting[i] == 0) st.ready.push_back(static_cast<int>(i));
    }
  }
  std::unordered_map<uint64_t, std::vector<uint8_t>> mailbox;
  std::unordered_map<uint64_t, int> waitingRecv;  // message -> receiving step
  std::vector<int> active;
  for (int r = 0; r < P; ++r)
    if (!state[r].ready.empty()) active.push_back(r);

  auto finish = [&](int r, int i) {
    RankState& st = state[r];
    --st.remaining;
    for (int j : st.dependents[i])
      if (--st.waiting[j] == 0) {
        if (st.ready.empty()) active.push_back(r);
        st.ready.push_back(j);
      }
  };
  auto deliver = [&](int r, int i, const std::vector<uint8_t>& payload) -> std::string {
    const algo::Step& s = plans[r].steps[i];
    if (payload.size() != s.dst.bytes)
      return strCat("rank ", r, " expects ", s.dst.bytes, " bytes from rank ", s.peer,
                    " as message ", state[r].index[i], " but ", payload.size(), " were sent");
    if (s.dst.bytes) std::memcpy(at(memory[r], s.dst), payload.data(), s.dst.bytes);
    finish(r, i);
    return "";
  };

  while (!active.empty()) {
    int r = active.back();
    active.pop_back();
    RankState& st = state[r];
    while (!st.ready.empty()) {
      int i = st.ready.back();
      st.ready.pop_back();
      const algo::Step& s = plans[r].steps[i];
      switch (s.kind) {
        case StepKind::kSend: {
          st.heldSends[s.peer].emplace(st.index[i], i);
          auto& held = st.heldSends[s.peer];
          uint32_t& next = st.nextSend[s.peer];
          while (!held.empty() && held.begin()->first == next) {
            const int send = held.begin()->second;
            held.erase(held.begin());
            ++next;
            const algo::Step& out = plans[r].steps[send];
            const uint8_t* src = at(memory[r], out.src);
            std::vector<uint8_t> payload(src, src + out.src.bytes);
            const uint64_t key = messageKey(r, out.peer, st.index[send]);
            if (auto w = waitingRecv.find(key); w != waitingRecv.end()) {
              int receiver = w->second;
              waitingRecv.erase(w);
              if (std::string e = deliver(out.peer, receiver, payload); !e.empty()) return e;
            } else {
              mailbox.emplace(key, std::move(payload));
            }
            finish(r, send);
          }
          continue;
        }
        case StepKind::kRecv: {
          const uint64_t key = messageKey(s.peer, r, st.index[i]);
          if (auto m = mailbox.find(key); m != mailbox.end()) {
            std::vector<uint8_t> payload = std::move(m->second);
            mailbox.erase(m);
            if (std::string e = deliver(r, i, payload); !e.empty()) return e;
          } else {
            waitingRecv.emplace(key, i);
          }
          continue;
        }
        case StepKind::kReduce:
          if (s.dst.bytes)
            reduceElements(at(memory[r], s.dst), at(memory[r], s.src), at(memory[r], s.src2),
                           s.dst.bytes / es, dtype, op);
          break;
        case StepKind::kCopy:
          if (s.dst.bytes) std::memmove(at(memory[r], s.dst), at(memory[r], s.src), s.dst.bytes);
          break;
        case StepKind::kAverage:
          if (s.dst.bytes) applyAverage(at(memory[r], s.dst), s.dst.bytes / es, dtype, P);
          break;
      }
      finish(r, i);
    }
  }
  for (int r = 0; r < P; ++r)
    if (state[r].remaining)
      return strCat("deadlock: rank ", r, " has ", state[r].remaining, " steps that cannot run");
  if (!mailbox.empty())
    return strCat(mailbox.size(), " messages were sent but never received (first from rank ",
                  mailbox.begin()->first >> 44, ")");
  return "";
}

}  // namespace braid::sim
