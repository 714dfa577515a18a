#include "src/selector.h"

#include <limits>

#include "src/common/strcat.h"

namespace braid {

using algo::CollectiveKind;

namespace {

constexpr CollectiveKind kSelectable[] = {
    CollectiveKind::kAllReduce, CollectiveKind::kBroadcast,     CollectiveKind::kReduce,
    CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllToAll,
    CollectiveKind::kGather,    CollectiveKind::kScatter,       CollectiveKind::kBarrier};

std::string namesOf(CollectiveKind kind) {
  std::string out;
  for (const auto& a : algo::allAlgorithms())
    if (a.kind == kind) out += strCat(out.empty() ? "" : ", ", a.name);
  return out;
}

std::string sizeText(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (bytes >= 1024 && u < 3) bytes /= 1024, ++u;
  return strCat(static_cast<long long>(bytes), " ", units[u]);
}

}  // namespace

bool collectiveFromName(const std::string& name, CollectiveKind* kind) {
  for (CollectiveKind k : kSelectable)
    if (algo::collectiveName(k) == name) {
      *kind = k;
      return true;
    }
  return false;
}

Status Selector::validate(const std::map<std::string, std::string>& forced) {
  for (const auto& [collective, name] : forced) {
    CollectiveKind kind;
    if (!collectiveFromName(collective, &kind)) {
      std::string known;
      for (CollectiveKind k : kSelectable)
        known += strCat(known.empty() ? "" : ", ", algo::collectiveName(k));
      return invalidArgument(
          strCat("BRAID_ALGO: unknown collective '", collective, "' (known: ", known, ")"));
    }
    if (!algo::findAlgorithm(kind, name))
      return invalidArgument(strCat("BRAID_ALGO: unknown algorithm '", name, "' for ", collective,
                                    " (known: ", namesOf(kind), ")"));
  }
  return Status::ok();
}

const algo::Algorithm& Selector::choose(const algo::CollectiveArgs& args) const {
  if (auto it = forced_.find(std::string(algo::collectiveName(args.kind))); it != forced_.end())
    if (const algo::Algorithm* a = algo::findAlgorithm(args.kind, it->second)) return *a;
  const algo::Algorithm* best = algo::defaultAlgorithm(args.kind);
  algo::Cost bestCost{std::numeric_limits<double>::infinity(), 0, 0};
  const algo::LinkModel link = link_.atSize(static_cast<double>(args.bytes()));
  // Equal predicted times go to the algorithm with fewer rounds (less
  // exposed to latency the model underrates), then to registry order, so
  // ranks never disagree.
  for (const auto& a : algo::allAlgorithms()) {
    if (a.kind != args.kind) continue;
    algo::Cost c = a.estimate(args, link);
    bool equal =
        c.seconds <= bestCost.seconds * (1 + 1e-9) && c.seconds >= bestCost.seconds * (1 - 1e-9);
    if (c.seconds < bestCost.seconds * (1 - 1e-9) || (equal && c.steps < bestCost.steps)) {
      bestCost = c;
      best = &a;
    }
  }
  return *best;
}

std::vector<const algo::Algorithm*> Selector::shortlist(const algo::CollectiveArgs& args) const {
  const algo::Algorithm& chosen = choose(args);
  if (forces(args.kind)) return {&chosen};
  const algo::LinkModel link = link_.atSize(static_cast<double>(args.bytes()));
  const double bound = chosen.estimate(args, link).seconds * kShortlistFactor;
  std::vector<const algo::Algorithm*> out;
  for (const auto& a : algo::allAlgorithms())
    if (a.kind == args.kind && (&a == &chosen || a.estimate(args, link).seconds <= bound))
      out.push_back(&a);
  return out;
}

std::string Selector::describe(int nranks, size_t chunkBytes) const {
  std::string out;
  for (CollectiveKind kind : kSelectable) {
    algo::CollectiveArgs args;
    args.kind = kind;
    args.nranks = nranks;
    args.dtype = DataType::kFloat32;
    args.chunkBytes = chunkBytes;
    std::string line = strCat(algo::collectiveName(kind), ":");
    std::string_view current;
    for (double bytes = 4; bytes <= double{1 << 30}; bytes *= 2) {
      args.count = static_cast<size_t>(bytes / 4);
      std::string_view name = choose(args).name;
      if (name == current) continue;
      line += current.empty() ? strCat(" ", name) : strCat(" < ", sizeText(bytes), " <= ", name);
      current = name;
    }
    out += (out.empty() ? "" : "; ") + line;
  }
  return out;
}

}  // namespace braid
