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

// Where a slice lands once in-place aliasing is resolved: (buffer, offset).
struct Region {
  BufferId buffer;
  size_t begin, end;
};
Region resolve(const RankMemory& m, const Slice& s) {
  if (s.buffer == BufferId::kSend && m.sendInRecv >= 0)
    return {BufferId::kRecv, m.sendInRecv + s.offset, m.sendInRecv + s.offset + s.bytes};
  if (s.buffer == BufferId::kRecv && m.recvInSend >= 0)
    return {BufferId::kSend, m.recvInSend + s.offset, m.recvInSend + s.offset + s.bytes};
  return {s.buffer, s.offset, s.offset + s.bytes};
}
bool overlap(const Region& a, const Region& b) {
  return a.buffer == b.buffer && a.begin < b.end && b.begin < a.end;
}

// What a step reads and writes. A Reduce may write its own operand.
void footprint(const algo::Step& s, const RankMemory& m, std::vector<Region>* reads,
               std::vector<Region>* writes) {
  reads->clear();
  writes->clear();
  auto add = [&](std::vector<Region>* to, const Slice& slice) {
    if (slice.bytes) to->push_back(resolve(m, slice));
  };
  switch (s.kind) {
    case StepKind::kSend:
      add(reads, s.src);
      break;
    case StepKind::kRecv:
      add(writes, s.dst);
      break;
    case StepKind::kRecvReduce:
      add(reads, s.src);
      add(writes, s.dst);
      break;
    case StepKind::kReduce:
      add(reads, s.src);
      add(reads, s.src2);
      add(writes, s.dst);
      break;
    case StepKind::kCopy:
      add(reads, s.src);
      add(writes, s.dst);
      break;
    case StepKind::kAverage:
      add(writes, s.dst);
      break;
  }
}

}  // namespace

std::string findRaces(const algo::Schedule& plan, const RankMemory& m) {
  const size_t n = plan.steps.size();
  const size_t words = n / 64 + 1;
  // before[j] has bit i set when step i must finish before step j starts.
  std::vector<std::vector<uint64_t>> before(n, std::vector<uint64_t>(words, 0));
  for (size_t j = 0; j < n; ++j)
    for (auto d : plan.steps[j].after)
      if (d != algo::kNoStep) {
        for (size_t w = 0; w < words; ++w) before[j][w] |= before[d][w];
        before[j][d / 64] |= uint64_t{1} << (d % 64);
      }
  std::vector<Region> readsI, writesI, readsJ, writesJ;
  for (size_t j = 0; j < n; ++j) {
    footprint(plan.steps[j], m, &readsJ, &writesJ);
    if (writesJ.empty() && readsJ.empty()) continue;
    for (size_t i = 0; i < j; ++i) {
      if (before[j][i / 64] >> (i % 64) & 1) continue;
      footprint(plan.steps[i], m, &readsI, &writesI);
      for (const Region& w : writesJ)
        for (const auto* other : {&readsI, &writesI})
          for (const Region& r : *other)
            if (overlap(w, r))
              return strCat("steps ", i, " and ", j, " may run together and touch the same bytes");
      for (const Region& w : writesI)
        for (const Region& r : readsJ)
          if (overlap(w, r))
            return strCat("steps ", i, " and ", j, " may run together and touch the same bytes");
    }
  }
  return "";
}

// Event driven: a send lands in a mailbox or completes the receive already
// waiting for it; a receive takes its message or waits for it. Every step
// is handled once, so thousands of ranks simulate in seconds.
std::string run(const std::vector<algo::Schedule>& plans, std::vector<RankMemory>& memory,
                DataType dtype, RedOp op, Delivery delivery) {
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
      if (steps[i].kind == StepKind::kSend || algo::receives(steps[i].kind)) {
        if (steps[i].peer < 0 || steps[i].peer >= P)
          return strCat("rank ", r, " step ", i, " talks to rank ", steps[i].peer);
        st.index[i] = (steps[i].kind == StepKind::kSend ? sends : recvs)[steps[i].peer]++;
      }
      if (st.waiting[i] == 0) st.ready.push_back(static_cast<int>(i));
    }
  }
  std::unordered_map<uint64_t, std::vector<uint8_t>> mailbox;
  // kRendezvous: message -> the send step still waiting for its receive.
  std::unordered_map<uint64_t, std::pair<int, int>> unmatchedSend;
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
    if (s.dst.bytes && s.kind == StepKind::kRecvReduce && s.incomingFirst)
      reduceElements(at(memory[r], s.dst), payload.data(), at(memory[r], s.src), s.dst.bytes / es,
                     dtype, op);
    else if (s.dst.bytes && s.kind == StepKind::kRecvReduce)
      reduceElements(at(memory[r], s.dst), at(memory[r], s.src), payload.data(), s.dst.bytes / es,
                     dtype, op);
    else if (s.dst.bytes)
      std::memcpy(at(memory[r], s.dst), payload.data(), s.dst.bytes);
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
              finish(r, send);
            } else {
              mailbox.emplace(key, std::move(payload));
              if (delivery == Delivery::kBuffered)
                finish(r, send);
              else
                unmatchedSend.emplace(key, std::pair{r, send});
            }
          }
          continue;
        }
        case StepKind::kRecv:
        case StepKind::kRecvReduce: {
          const uint64_t key = messageKey(s.peer, r, st.index[i]);
          if (auto m = mailbox.find(key); m != mailbox.end()) {
            std::vector<uint8_t> payload = std::move(m->second);
            mailbox.erase(m);
            if (auto u = unmatchedSend.find(key); u != unmatchedSend.end()) {
              finish(u->second.first, u->second.second);
              unmatchedSend.erase(u);
            }
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
