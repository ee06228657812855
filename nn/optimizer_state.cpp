#include "nn/optimizer_state.hpp"

#include <string>

#include "dsl/error.hpp"
#include "dsl/ops.hpp"
#include "dsl/sharding_thresholds.hpp"

namespace tessera {

// Each data-parallel device keeps and updates its slice of the state: the gradient arrives by
// reduce_scatter and the new weights leave by all_gather, the same bytes as one all_reduce and
// 1/N of the update's memory traffic. Small variables keep replicated state.
Variable sharded_state_like(const Variable& v) {
  const Layout& layout = v.layout();
  if (v.value().node()->numel() * dtype_size(v.dtype()) < kShardingMinimumBytes)  // a bias: one all_reduce beats two collectives
    return Variable(zeros(v.shape(), layout.without_partial(), v.dtype()));
  std::vector<std::vector<int64_t>> axes = layout.axis_mesh_dims();
  std::vector<int64_t> free_dims;
  for (int64_t d = 0; d < layout.mesh().ndim(); ++d)
    if (!layout.sharded_axis_of(d) && !layout.partial_ops()[d] && layout.mesh().shape()[d] > 1) free_dims.push_back(d);
  for (auto& dims : axes)
    if (dims.empty() && !free_dims.empty()) {
      dims = free_dims;
      free_dims.clear();
    }
  return Variable(zeros(v.shape(), Layout(layout.mesh(), axes), v.dtype()));
}

void check_gradients(const std::vector<Variable>& vars, const std::vector<Tensor>& grads, const char* who) {
  if (vars.size() != grads.size())
    throw ShapeError(std::string(who) + ".apply: " + std::to_string(grads.size()) + " gradients for " +
                     std::to_string(vars.size()) + " variables");
}

}  // namespace tessera
