// Redistribute planning: the cheapest sequence of per-mesh-dim steps that turns one layout into
// another. Each step changes the placement of ONE mesh dim:
//   Shard(i) -> Replicate        all_gather      (the mesh dim must be axis i's innermost)
//   Shard(i) -> Shard(j)         all_to_all      (never all_gather + chunk)
//   Partial  -> Replicate        all_reduce
//   Partial  -> Shard(j)         reduce_scatter
//   Replicate -> Shard(j)        local chunk     (no communication)
//   Replicate -> Partial(op)     local           (sum/product: coordinate 0 keeps the value,
//                                                 the others hold the identity; avg/max/min: all keep it)
// A new Shard always becomes the innermost mesh dim of its axis. The plan is a shortest path
// (Dijkstra) over layouts, costed by the bytes all devices receive, so sharding steps that
// shrink data run before gathers that grow it; ties go to the plan with fewer steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsl/dtype.hpp"
#include "dsl/layout.hpp"
#include "ir/redistribute_step.hpp"

namespace tessera {

// LayoutError when the layouts' meshes or ranks differ.
std::vector<RedistributeStep> plan_redistribute(const std::vector<int64_t>& global_shape, DType dtype,
                                                const Layout& from, const Layout& to);

std::string describe_plan(const std::vector<RedistributeStep>& plan);

}  // namespace tessera
