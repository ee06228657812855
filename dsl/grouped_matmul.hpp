// Grouped matrix multiplication, the building block of dropless mixture of experts (PyTorch's
// torch._grouped_mm): x's rows come in consecutive groups, one per expert, and group e is
// multiplied by its own weight w[e]. The group sizes are a tensor computed on the devices (a
// router's bincount), so one compiled program serves every routing: the sizes reach the kernel
// as a buffer, never as a trace-time constant.
//
// Sizes that do not describe x's rows (a negative one, or more rows than x has) are checked when
// the step runs (dsl/index_check.hpp) and raise an IndexError naming the op and the value.
#pragma once

#include <vector>

#include "dsl/node.hpp"
#include "dsl/ops.hpp"

namespace tessera {

// x [N, K], w [E, K, F], group_sizes [E] (int32 / int64) -> [N, F]: rows [off_e, off_e + size_e)
// of the output are x's same rows times w[e], off_e the sum of the earlier sizes; rows past the
// sum of all sizes (padding) are zero. Differentiable in x and w. x and w are floating, of one
// dtype (as matmul's operands). Sharding: w split on F gives an output split on its last axis,
// w and x split on K a Partial(sum); x's rows may be split (each device its rows' products).
Tensor grouped_matmul(const Tensor& x, const Tensor& w, const Tensor& group_sizes, Loc where = Loc::current());

namespace detail {
// The primitives, on `ends` (int64 [E], the running totals of the sizes, already checked):
// group e is rows [ends[e - 1], ends[e]) (ends[-1] = 0).
Tensor grouped_dot(const Tensor& x, const Tensor& w, const Tensor& ends, Loc where);              // [N, F]
Tensor grouped_weight_grad(const Tensor& x, const Tensor& dy, const Tensor& ends, Loc where);     // [E, K, F]: x_e^T dy_e
// Whether a grouped primitive's bounds count the rows of each device's own block (built on
// local_map's local values) rather than global rows.
bool grouped_bounds_are_local(const NodeAttrs& attrs);
// A grouped primitive `n` computed from ordinary ops on `inputs` (its inputs, maybe rebuilt):
// each expert's product over every row, masked to its group's rows and summed (E times the
// multiplications). For targets without the grouped GEMM (jit/library_fallback.hpp).
NodeRef grouped_from_ops(const Node& n, const std::vector<NodeRef>& inputs);
}  // namespace detail

}  // namespace tessera
