// Reordering a local program: the passes that move nodes (partitioner/recompute_placement.hpp,
// partitioner/reduction_placement.hpp) choose an order; this applies it.
#pragma once

#include <vector>

#include "ir/local_program.hpp"

namespace tessera {

// Puts the program's nodes in `order` (node indices, each once, every node after its inputs),
// renumbering the nodes' inputs and the program's outputs.
void reorder_nodes(LocalProgram& program, const std::vector<int>& order);

}  // namespace tessera
