// Partitioning a pending graph into one local program (ir/local_program.hpp), in two phases:
// whole-graph sharding propagation (propagation.hpp) gives every node its natural layout and
// the layouts its op needs of its inputs; SPMD expansion (expansion.hpp) then materialises each
// node in the layouts its consumers want, inserting the redistributes.
#pragma once

#include <optional>
#include <vector>

#include "ir/local_program.hpp"

namespace tessera {

struct PartitionRequest {
  std::vector<NodeRef> outputs;
  std::vector<std::optional<Layout>> output_layouts;  // empty or one per output
  Target target;  // what the program is compiled for (ir/target.hpp), as the driver bound it
};

LocalProgram partition(const PartitionRequest& request);

// The layout `node`'s value will have when forced on its own for `target` (propagation only,
// runs nothing).
Layout propagated_layout(const NodeRef& node, const Target& target);
// Several nodes' layouts from one propagation (each answer kept as propagated_layout keeps it):
// asking a model's gradients one by one would propagate the backward graph once for each.
std::vector<Layout> propagated_layouts(const std::vector<NodeRef>& nodes, const Target& target);

}  // namespace tessera
