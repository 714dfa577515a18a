#include "tests/harness/sim_network.h"

#include <cstring>
#include <map>

#include "src/common/reduce.h"
#include "src/common/strcat.h"

namespace braid::sim {

using algo::BufferId;
using algo::Slice;
using algo::StepKind;

namespace {

struct RankState {
  std::vector<int> waiting;
  std::vector<uint32_t> index;  // k of each Send/Recv
  std::vector<bool> done;
  std::vector<int> ready;
  std::vector<int> blockedRecvs;
  std::vector<std::vector<int>> dependents;
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

}  // namespace

std::string run(const std::vector<algo::Schedule>& plans, std::vector<RankMemory>& memory,
                DataType dtype, RedOp op) {
  const int P = static_cast<int>(plans.size());
  const size_t es = dataTypeSize(dtype);
  std::vector<RankState> state(P);
  // messages[{from, to}][k]
  std::map<std::pair<int, int>, std::map<uint32_t, std::vector<uint8_t>>> messages;
  for (int r = 0; r < P; ++r) {
    const auto& steps = plans[r].steps;
    memory[r].scratch.assign(plans[r].scratchBytes, 0xAB);
    RankState& st = state[r];
    st.waiting.assign(steps.size(), 0);
    st.index.assign(steps.size(), 0);
    st.done.assign(steps.size(), false);
    st.remaining = steps.size();
    st.dependents.assign(steps.size(), {});
    std::map<int, uint32_t> sends, recvs;
    for (size_t i = 0; i < steps.size(); ++i) {
      for (auto d : steps[i].after)
        if (d != algo::kNoStep) {
          if (d < 0 || static_cast<size_t>(d) >= i)
            return strCat("rank ", r, " step ", i, " waits for a later step");
          ++st.waiting[i];
          st.dependents[d].push_back(static_cast<int>(i));
        }
      if (steps[i].kind == StepKind::kSend) st.index[i] = sends[steps[i].peer]++;
      if (steps[i].kind == StepKind::kRecv) st.index[i] = recvs[steps[i].peer]++;
      if (st.waiting[i] == 0) st.ready.push_back(static_cast<int>(i));
    }
  }
  auto finish = [&](int r, int i) {
    RankState& st = state[r];
    st.done[i] = true;
    --st.remaining;
    for (int j : st.dependents[i])
      if (--st.waiting[j] == 0) st.ready.push_back(j);
  };
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < P; ++r) {
      RankState& st = state[r];
      const auto& steps = plans[r].steps;
      std::vector<int> ready = std::move(st.ready);
      st.ready.clear();
      for (int i : st.blockedRecvs) ready.push_back(i);
      st.blockedRecvs.clear();
      for (int i : ready) {
        const algo::Step& s = steps[i];
        switch (s.kind) {
          case StepKind::kSend: {
            if (s.peer < 0 || s.peer >= P) return strCat("rank ", r, " sends to rank ", s.peer);
            const uint8_t* src = at(memory[r], s.src);
            messages[{r, s.peer}][st.index[i]] = std::vector<uint8_t>(src, src + s.src.bytes);
            break;
          }
          case StepKind::kRecv: {
            auto& box = messages[{s.peer, r}];
            auto it = box.find(st.index[i]);
            if (it == box.end()) {
              st.blockedRecvs.push_back(i);
              continue;
            }
            if (it->second.size() != s.dst.bytes)
              return strCat("rank ", r, " expects ", s.dst.bytes, " bytes from rank ", s.peer,
                            " as message ", st.index[i], " but ", it->second.size(), " were sent");
            if (s.dst.bytes) std::memcpy(at(memory[r], s.dst), it->second.data(), s.dst.bytes);
            box.erase(it);
            break;
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
        moved = true;
        finish(r, i);
      }
    }
  }
  for (int r = 0; r < P; ++r)
    if (state[r].remaining)
      return strCat("deadlock: rank ", r, " has ", state[r].remaining, " steps that cannot run");
  for (auto& [pair, box] : messages)
    if (!box.empty())
      return strCat(box.size(), " messages from rank ", pair.first, " to rank ", pair.second,
                    " were never received");
  return "";
}

}  // namespace braid::sim
