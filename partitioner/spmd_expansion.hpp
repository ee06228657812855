// Partitioning a pending graph: whole-graph sharding propagation, then SPMD expansion into one
// local program (local_program.hpp).
//
// Propagation runs forward from the values already computed (their layouts are fixed), sources
// with a requested layout, and with_layout constraints; each op's rule picks its output layout
// by the cost of the redistributes it needs. Constants, iota and random numbers with no layout
// of their own are "free": they take whatever layout their consumer wants.
// Expansion then materialises every node in the layout its consumers need: either computing it
// there directly (cheap ops whose inputs are available in the matching layouts without
// communication) or computing it where it naturally lands and redistributing. Outputs handed to
// the user have their Partials reduced unless a Partial layout was requested.
#pragma once

#include <optional>
#include <vector>

#include "ir/local_program.hpp"

namespace tessera {

struct PartitionRequest {
  std::vector<NodeRef> outputs;
  std::vector<std::optional<Layout>> output_layouts;  // empty or one per output
  bool deterministic = false;  // the program's Target (ir/target.hpp), as the driver bound it
};

LocalProgram partition(const PartitionRequest& request);

// The layout `node`'s value will have when forced on its own (propagation only, runs nothing).
Layout propagated_layout(const NodeRef& node, bool deterministic);

}  // namespace tessera
