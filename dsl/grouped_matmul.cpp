#include "dsl/grouped_matmul.hpp"

#include "dsl/error.hpp"
#include "dsl/index_check.hpp"
#include "dsl/sorting.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

[[noreturn]] void grouped_shape_error(const std::string& what, Loc at) { throw ShapeError("grouped_matmul: " + what + at_line(at)); }

// A rank-`rank` int64 mask [E, N, 1, ...]: 1 where row n lies in group e (ends [E]: the groups'
// running totals).
Tensor rows_in_groups(const Tensor& ends, int64_t rows, int64_t rank, Loc at) {
  const int64_t e = ends.shape()[0];
  std::vector<int64_t> row_shape(size_t(rank), 1), end_shape(size_t(rank), 1);
  row_shape[1] = rows;
  end_shape[0] = e;
  NodeAttrs iota;
  iota.axes = {1};
  const Tensor row(make_node(OpKind::Iota, DType::i64, row_shape, {}, iota, at));
  const Tensor end = reshape(ends, end_shape, at);
  // The previous group's end: ends shifted down by one, 0 first.
  const Tensor begin = reshape(pad(slice(ends, {0}, {e - 1}, at), {{1, 0}}, 0.0, at), end_shape, at);
  return cast(begin <= row, DType::i64, at) * cast(row < end, DType::i64, at);
}

// Inside local_map (x a local value) each device's rows are its own: the bounds start at its
// block's first row. attrs.axes = {1} there, {0} for a global x.
NodeAttrs grouped_attrs(const Tensor& x) {
  NodeAttrs attrs;
  attrs.axes = {x.node()->local ? 1 : 0};
  return attrs;
}

}  // namespace

namespace detail {

bool grouped_bounds_are_local(const NodeAttrs& attrs) { return !attrs.axes.empty() && attrs.axes[0] == 1; }

Tensor grouped_dot(const Tensor& x, const Tensor& w, const Tensor& ends, Loc at) {
  return Tensor(make_node(OpKind::GroupedDot, x.dtype(), {x.shape()[0], w.shape()[2]}, {x.node(), w.node(), ends.node()},
                          grouped_attrs(x), at));
}

Tensor grouped_weight_grad(const Tensor& x, const Tensor& dy, const Tensor& ends, Loc at) {
  return Tensor(make_node(OpKind::GroupedWeightGrad, x.dtype(), {ends.shape()[0], x.shape()[1], dy.shape()[1]},
                          {x.node(), dy.node(), ends.node()}, grouped_attrs(x), at));
}

NodeRef grouped_from_ops(const Node& n, const std::vector<NodeRef>& inputs) {
  const Loc at = n.where;
  const Tensor x(inputs[0]), other(inputs[1]), ends(inputs[2]);
  const int64_t rows = x.shape()[0];
  const Tensor zero(make_node(OpKind::Full, n.dtype, {}, {}, {}, at));
  if (n.op == OpKind::GroupedDot) {
    // [E, N, F]: every expert's product over every row, kept on its own group's rows.
    const Tensor products = matmul(expand_dims(x, 0, at), other, at);
    return reduce_sum(where(rows_in_groups(ends, rows, 3, at) > 0, products, zero, at), {0}, false, at).node();
  }
  // dy masked per expert [E, N, F], contracted with x over the rows.
  const Tensor masked = where(rows_in_groups(ends, rows, 3, at) > 0, expand_dims(other, 0, at), zero, at);
  return matmul(expand_dims(transpose(x, {1, 0}, at), 0, at), masked, at).node();
}

}  // namespace detail

Tensor grouped_matmul(const Tensor& x, const Tensor& w, const Tensor& group_sizes, Loc at) {
  if (x.rank() != 2) grouped_shape_error("x must be [N, K], got shape " + shape_string(x.shape()), at);
  if (w.rank() != 3) grouped_shape_error("w must be [E, K, F], got shape " + shape_string(w.shape()), at);
  if (group_sizes.rank() != 1) grouped_shape_error("group_sizes must be [E], got shape " + shape_string(group_sizes.shape()), at);
  if (x.shape()[1] != w.shape()[1])
    grouped_shape_error("K differs: x " + shape_string(x.shape()) + " has " + std::to_string(x.shape()[1]) + " columns, w " +
                            shape_string(w.shape()) + " " + std::to_string(w.shape()[1]) + " rows per expert",
                        at);
  if (group_sizes.shape()[0] != w.shape()[0])
    grouped_shape_error("group_sizes has " + std::to_string(group_sizes.shape()[0]) + " entries, w " + shape_string(w.shape()) +
                            " has " + std::to_string(w.shape()[0]) + " experts",
                        at);
  if (group_sizes.dtype() != DType::i32 && group_sizes.dtype() != DType::i64)
    throw DTypeError("grouped_matmul: group_sizes must be int32 or int64, got " + std::string(dtype_name(group_sizes.dtype())) + at_line(at));
  if (!is_floating(x.dtype()) || !is_floating(w.dtype()))
    throw DTypeError("grouped_matmul: x and w must be floating, got " + std::string(dtype_name(x.dtype())) + " and " +
                     std::string(dtype_name(w.dtype())) + at_line(at));
  if (x.dtype() != w.dtype())  // matmul's rule: no silent promotion of a product's operands
    throw DTypeError("grouped_matmul: x and w have different dtypes " + std::string(dtype_name(x.dtype())) + " and " +
                     std::string(dtype_name(w.dtype())) + "; cast one first" + at_line(at));
  const int64_t rows = x.shape()[0];
  // Checked when the step runs: each size in [0, N], then each running total (so the sum) <= N.
  const Tensor sizes = check_index(group_sizes, 0, rows + 1, IndexUse::GroupSize, at);
  Tensor ends = check_index(cumsum(sizes, 0, at), 0, rows + 1, IndexUse::GroupSizesTotal, at);
  if (x.node()->extents && !x.node()->extents->axes[0].is_constant()) {
    // Inside local_map over uneven blocks N is the first (largest) block's: a smaller block's
    // totals are checked against its own rows too (its kernel reads and writes only those, so
    // rows past them would be dropped without a word). Each total is moved up by what the
    // block lacks, checked against N, and moved back.
    const Tensor column = slice(x, std::vector<int64_t>(size_t(x.rank()), 0), [&] {
      std::vector<int64_t> size(size_t(x.rank()), 1);
      size[0] = rows;
      return size;
    }(), at);
    const Tensor rows_here = reduce_sum(where(column == Operand(column, at), Operand(int64_t(1), at), Operand(int64_t(1), at), at), {}, false, at);
    const Tensor lacking = sub(Operand(rows, at), Operand(cast(rows_here, ends.dtype(), at), at));
    const Tensor moved = check_index(add(Operand(ends, at), Operand(lacking, at)), 0, rows + 1, IndexUse::GroupSizesTotalOnDevice, at);
    ends = sub(Operand(moved, at), Operand(lacking, at));
  }
  // The GEMMs take f32, f64 and bf16 operands; f16 ones are computed in f32.
  if (x.dtype() == DType::f16)
    return cast(detail::grouped_dot(cast(x, DType::f32, at), cast(w, DType::f32, at), ends, at), DType::f16, at);
  return detail::grouped_dot(x, w, ends, at);
}

}  // namespace tessera
