// One step of a redistribute: the placement of ONE mesh dim changes (a collective over that
// dim's device groups, or a local chunk / local partial split). Steps are planned by the
// partitioner (partitioner/redistribute_plan.hpp) and by local_map's functional collectives, and
// run by jit/redistribute_executor.hpp; the local program (ir/local_program.hpp) holds them.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "dsl/layout.hpp"
#include "dsl/op_kind.hpp"

namespace tessera {

// The collectives (dsl/op_kind.hpp's TESSERA_COLLECTIVES, shared with local_map's ops) and
// LocalPartial, the local split of a replicated value into partial terms. Shift (each device's
// block sent to another: a rotation or any static permutation) is never planned: only
// local_map's shift() and permute() make one.
enum class RedistributeKind {
#define TESSERA_REDISTRIBUTE_KIND_ENUM(name, text, ...) name,
  TESSERA_COLLECTIVES(TESSERA_REDISTRIBUTE_KIND_ENUM, _)
#undef TESSERA_REDISTRIBUTE_KIND_ENUM
  LocalPartial,
};

std::string_view redistribute_kind_name(RedistributeKind kind);  // "all_gather", ..., "local_partial"
// Whether it communicates (LocalChunk and LocalPartial are local).
bool is_collective(RedistributeKind kind);
// The step a functional collective op runs as; InternalError for any other op.
RedistributeKind redistribute_kind_of(OpKind op);

struct RedistributeStep {
  RedistributeKind kind;
  int64_t mesh_dim;
  Layout before, after;
  ReduceOp op = ReduceOp::Sum;   // reduce op of all_reduce / reduce_scatter / local partial
  int64_t estimated_bytes = 0;   // bytes all devices of the mesh receive (the planner's cost)
  std::vector<int64_t> destinations = {};  // Shift: coordinate i sends to coordinate destinations[i]
};

}  // namespace tessera
