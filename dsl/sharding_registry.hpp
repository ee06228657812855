// register_sharding (PyTorch's torch.distributed.tensor.experimental.register_sharding): user
// sharding strategies for an op. Each strategy lists the placements the op's tensor inputs must
// arrive in and the placements of its output. When the op is called on tensors of a mesh, the
// strategy whose input redistributes move the fewest bytes (the partitioner's cost model, from
// the layouts propagation gives the inputs) is taken: the inputs are constrained to it and the
// output is produced in its output placements, so propagation continues from there.
//
// Ops that consult the registry, by name: "softmax", "log_softmax", "matmul", the unary ops
// ("exp", "log", "sqrt", "tanh", "neg", "abs") and the reductions ("reduce_sum", "reduce_max",
// "reduce_min", "reduce_prod"). A strategy for any other name is kept but never consulted.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/ops.hpp"

namespace tessera {

struct ShardingStrategy {
  std::vector<Placement> output;               // one per mesh dim
  std::vector<std::vector<Placement>> inputs;  // one per tensor input; an empty list: as it comes (PyTorch's None)
};

// What a strategy function sees of the call (PyTorch hands it the op's arguments).
struct ShardingCall {
  std::string op;
  std::vector<std::vector<int64_t>> input_shapes;
  std::vector<int64_t> axes;  // the op's axes, non-negative: softmax's axis, a reduction's axes
  Mesh mesh;
};

using ShardingStrategyFn = std::function<std::vector<ShardingStrategy>(const ShardingCall&)>;

// Registers (or replaces) the strategies of `op`.
void register_sharding(const std::string& op, ShardingStrategyFn strategies);
void register_sharding(const std::vector<std::string>& ops, ShardingStrategyFn strategies);
// Back to the built-in rules.
void deregister_sharding(const std::string& op);

namespace detail {

// False while no strategy is registered (ops skip the registry then).
bool any_registered_sharding();

// Builds op `op` with `build`, applying the registered strategy when there is one for it and the
// inputs live on a mesh (LayoutError for a strategy that does not fit the call).
Tensor with_registered_sharding(std::string_view op, const std::vector<Tensor>& inputs, std::vector<int64_t> axes,
                                const std::function<Tensor(const std::vector<Tensor>&)>& build, Loc where);

// Defined by the partitioner: the cost model's price of moving a value between two layouts.
int64_t redistribute_cost(const std::vector<int64_t>& shape, DType dtype, const Layout& from, const Layout& to);

}  // namespace detail
}  // namespace tessera
