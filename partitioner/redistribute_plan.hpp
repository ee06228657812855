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

namespace tessera {

// Shift (a ring send/receive) is never planned: only local_map's shift() makes one.
enum class RedistributeKind { AllGather, AllToAll, AllReduce, ReduceScatter, LocalChunk, LocalPartial, Shift };

std::string_view redistribute_kind_name(RedistributeKind kind);  // "all_gather", ..., "local_chunk"
bool is_collective(RedistributeKind kind);

struct RedistributeStep {
  RedistributeKind kind;
  int64_t mesh_dim;
  Layout before, after;
  ReduceOp op = ReduceOp::Sum;   // reduce op of all_reduce / reduce_scatter / local partial
  int64_t estimated_bytes = 0;   // bytes all devices of the mesh receive (the planner's cost)
  int64_t offset = 0;            // Shift: coordinate i sends to coordinate (i + offset) mod n
};

// LayoutError when the layouts' meshes or ranks differ.
std::vector<RedistributeStep> plan_redistribute(const std::vector<int64_t>& global_shape, DType dtype,
                                                const Layout& from, const Layout& to);

std::string describe_plan(const std::vector<RedistributeStep>& plan);

}  // namespace tessera
