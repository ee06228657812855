// Sharding rules: for one op, given its inputs' layouts, the layout of its output and the layouts
// its inputs must be brought to (redistributes are inserted where they differ). Rules are written
// per tensor axis over the ordered mesh-dim lists, which covers every mesh dim at once:
//   elementwise   (i, j) -> (i, j): the cheapest of the inputs' shardings wins;
//   dot           (b, m, k) x (b, k, n) -> (b, m, n): a sharded k gives Partial(sum);
//   attention     q (b, lq, e), k (b, lk, e), v (b, lk, ev): q's rows may stay sharded, k's and v's
//                 are gathered; dk and dv are Partial(sum) over q's row shards;
//   grouped_dot   x (n, k), w (e, k, f) -> (n, f): rows and f stay sharded, a sharded k gives
//                 Partial(sum), e and the group bounds whole; its weight gradient is Partial(sum)
//                 over row shards;
//   take_rows     (table [V, D], ids [N]) -> [N, D]: a sharded V gives Partial(sum); its gradient
//                 scatter_add_rows is Partial(sum) over the shards of N;
//   reduce        reduced sharded axes give Partial(op);
//   movement      shardings follow the axes they move; axes whose blocks would change are unsharded.
// Partial passes only through ops linear for its reduce op (sum: add/sub of two partials, scaling
// by a non-partial value, negation, float casts; max/min: max/min with non-partial values; every
// reduce op: movement and the same reduce); everywhere else it is reduced first.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "dsl/node.hpp"
#include "ir/target.hpp"

namespace tessera {


struct ShardingDecision {
  Layout output;
  std::vector<Layout> inputs;
};

// Cost (bytes, cost_model.hpp) of moving a value of `node`'s input `i` from one layout to another.
using RedistributeCostFn = std::function<int64_t(const Node& value, const Layout& from, const Layout& to)>;

// `free_inputs[i]`: input i can be produced in any layout at no cost (constants, iota, random).
// `target` says whether partial sums are allowed (avoid_partial_sum).
ShardingDecision decide_sharding(const Node& node, const std::vector<Layout>& inputs,
                                 const std::vector<bool>& free_inputs, const RedistributeCostFn& cost, const Target& target);

// A dot computed straight into the non-partial layout `output`: its contraction is gathered and
// its operands are brought to output's shardings of their free axes. The partitioner prefers it
// to a partial sum plus reduce_scatter when moving the operands is cheaper (a data-parallel
// weight gradient wanted sharded: all_to_all and all_gather of activations instead of a
// reduce_scatter of the whole gradient).
ShardingDecision dot_producing(const Node& node, const Layout& output);

// Partial sums (floating point) are avoided for deterministic targets: their value depends on
// how the mesh splits the sum.
bool avoid_partial_sum(DType dtype, const Target& target);

// For cheap ops (elementwise, movement): the input layouts from which the op computes `output`
// locally, with no communication; nullopt when it cannot.
std::optional<std::vector<Layout>> layouts_producing(const Node& node, const Layout& output);

}  // namespace tessera
