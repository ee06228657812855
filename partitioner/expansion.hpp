// SPMD expansion: the second phase of partitioning (spmd_expansion.hpp). Turns a propagation
// result into one local program (ir/local_program.hpp).
//
// Every node is materialised in the layout its consumers need: either computed there directly
// (cheap ops whose inputs are available in the matching layouts without communication) or
// computed where it naturally lands and redistributed. Outputs handed to the user have their
// Partials reduced unless a Partial layout was requested.
#pragma once

#include "ir/local_program.hpp"
#include "partitioner/propagation.hpp"
#include "partitioner/spmd_expansion.hpp"

namespace tessera {

// `propagation` must have run over `request.outputs`; its cost memo is reused.
LocalProgram expand(ShardingPropagation& propagation, const PartitionRequest& request);

}  // namespace tessera
