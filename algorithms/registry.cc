#include "algorithms/algorithm.h"

namespace braid::algo {
namespace {

// Within a collective, the order is the selector's last tie-break. The cost
// model ties the ring, halving and dbtree AllReduce at two ranks (each rank
// sends and reduces half the vector in two rounds); measured on one host,
// dbtree and halving were up to 1.3x faster than the ring there
// (docs/ALGORITHMS.md), so they come first.
constexpr Algorithm kAlgorithms[] = {
    {CollectiveKind::kAllReduce, "dbtree", planAllReduceDbtree, estimateAllReduceDbtree},
    {CollectiveKind::kAllReduce, "halving", planAllReduceHalving, estimateAllReduceHalving},
    {CollectiveKind::kAllReduce, "ring", planAllReduceRing, estimateAllReduceRing},
    {CollectiveKind::kReduceScatter, "ring", planReduceScatterRing, estimateReduceScatterRing},
    {CollectiveKind::kAllGather, "ring", planAllGatherRing, estimateAllGatherRing},
    {CollectiveKind::kBroadcast, "tree", planBroadcastTree, estimateBroadcastTree},
    {CollectiveKind::kReduce, "tree", planReduceTree, estimateReduceTree},
    {CollectiveKind::kGather, "linear", planGatherLinear, estimateGatherLinear},
    {CollectiveKind::kScatter, "linear", planScatterLinear, estimateScatterLinear},
    {CollectiveKind::kAllToAll, "pairwise", planAllToAllPairwise, estimateAllToAllPairwise},
    {CollectiveKind::kAllReduce, "butterfly", planAllReduceButterfly, estimateAllReduceButterfly},
    {CollectiveKind::kBroadcast, "chain", planBroadcastChain, estimateBroadcastChain},
    {CollectiveKind::kBroadcast, "scatter_allgather", planBroadcastScatterAllGather,
     estimateBroadcastScatterAllGather},
    {CollectiveKind::kReduce, "rs_gather", planReduceScatterGather, estimateReduceScatterGather},
    {CollectiveKind::kAllGather, "doubling", planAllGatherDoubling, estimateAllGatherDoubling},
    {CollectiveKind::kAllGather, "bruck", planAllGatherBruck, estimateAllGatherBruck},
    {CollectiveKind::kReduceScatter, "halving", planReduceScatterHalving,
     estimateReduceScatterHalving},
    {CollectiveKind::kAllToAll, "bruck", planAllToAllBruck, estimateAllToAllBruck},
    {CollectiveKind::kGather, "binomial", planGatherBinomial, estimateGatherBinomial},
    {CollectiveKind::kScatter, "binomial", planScatterBinomial, estimateScatterBinomial},
    {CollectiveKind::kBarrier, "dissemination", planBarrierDissemination,
     estimateBarrierDissemination},
};

}  // namespace

std::span<const Algorithm> allAlgorithms() {
  return kAlgorithms;
}

const Algorithm* findAlgorithm(CollectiveKind kind, std::string_view name) {
  for (const auto& a : kAlgorithms)
    if (a.kind == kind && a.name == name) return &a;
  return nullptr;
}

const Algorithm* defaultAlgorithm(CollectiveKind kind) {
  for (const auto& a : kAlgorithms)
    if (a.kind == kind) return &a;
  return nullptr;
}

Schedule planOwnInput(const CollectiveArgs& args) {
  Schedule plan;
  if (!args.inPlace)
    plan.copy({BufferId::kRecv, 0, args.bytes()}, {BufferId::kSend, 0, args.bytes()});
  return plan;
}

std::string_view collectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "allreduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kReduce:
      return "reduce";
    case CollectiveKind::kAllGather:
      return "allgather";
    case CollectiveKind::kReduceScatter:
      return "reducescatter";
    case CollectiveKind::kAllToAll:
      return "alltoall";
    case CollectiveKind::kGather:
      return "gather";
    case CollectiveKind::kScatter:
      return "scatter";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kSendRecv:
      return "sendrecv";
  }
  return "?";
}

size_t sendBufferBytes(const CollectiveArgs& a) {
  switch (a.kind) {
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll:
    case CollectiveKind::kScatter:
      return a.bytes() * a.nranks;
    case CollectiveKind::kBarrier:
      return 0;
    default:
      return a.bytes();
  }
}

size_t recvBufferBytes(const CollectiveArgs& a) {
  switch (a.kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll:
    case CollectiveKind::kGather:
      return a.bytes() * a.nranks;
    case CollectiveKind::kBarrier:
      return 0;
    default:
      return a.bytes();
  }
}

}  // namespace braid::algo
