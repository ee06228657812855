// TESSERA_DETERMINISTIC=1: results bitwise identical on every mesh and device count.
//  - The partitioner never splits a floating-point sum across devices: sums over a sharded axis
//    and matmuls with a sharded contraction gather their inputs instead of producing Partials.
//  - Kernels keep every reduction in source order (no reassociation, so no vectorised tree
//    sums whose shape would depend on a block's extent).
// Cost: gathers instead of reduce_scatter / all_reduce of the smaller results, each device
// reducing whole axes, and scalar reductions (docs/PERFORMANCE_HISTORY.md has the numbers).
#pragma once

namespace tessera {

bool deterministic_mode();

}  // namespace tessera
