// JSON values of the topology types, for tools and tests that compose larger
// documents. topology.h offers the same as strings without this header's
// weight.
#pragma once

#include <nlohmann/json.hpp>

#include "topology/topology.h"

namespace braid::topo {

nlohmann::ordered_json toJsonValue(const RankTopology& rank);
// Strict: unknown members and wrong types are errors naming the member.
Result<RankTopology> rankFromJsonValue(const nlohmann::ordered_json& value);
Result<TopologyFile> topologyFileFromJsonValue(const nlohmann::ordered_json& value);

nlohmann::ordered_json toJsonValue(const TransportSet& set);  // ["cuda_ipc", "shm", "ib", "tcp"]
Result<TransportSet> transportSetFromJsonValue(const nlohmann::ordered_json& value);

nlohmann::ordered_json toJsonValue(const TransportMatrix& matrix);

}  // namespace braid::topo
