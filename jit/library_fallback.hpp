// Library ops a target lacks, built from their parts before the graph is partitioned. A user's
// program builds the same global graph on every target (a fused attention node wherever the
// fused form applies: dsl/attention.hpp; grouped GEMMs: dsl/grouped_matmul.hpp); the driver then replaces each node whose primitive the
// target's backend has no library kernel for (Target::library, ir/target.hpp) with the same
// computation in ordinary ops, and rebuilds the nodes downstream of it. Nothing else changes:
// values already computed, and so the program's inputs, stay the user's nodes.
#pragma once

#include <unordered_map>
#include <vector>

#include "dsl/node.hpp"
#include "ir/target.hpp"

namespace tessera {

struct FallbackGraph {
  std::vector<NodeRef> outputs;
  // Each node built here -> the user's node it stands for, where collectives are reported
  // (CommDebugMode, explain): a replaced primitive's parts stand for the primitive.
  std::unordered_map<const Node*, NodeRef> stands_for;
};

// `outputs` with every library op that `target` lacks computed from its parts; the same
// outputs, and nothing built, when the target lacks none that the graph uses.
FallbackGraph with_library_fallbacks(const std::vector<NodeRef>& outputs, const Target& target);

}  // namespace tessera
