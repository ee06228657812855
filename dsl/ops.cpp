#include "dsl/ops.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>

#include "dsl/element_count.hpp"
#include "dsl/index_check.hpp"
#include "dsl/sharding_registry.hpp"
#include "dsl/string_util.hpp"
#include "dsl/variable.hpp"

namespace tessera {
namespace detail {

void check_meshes(std::string_view op, const std::vector<NodeRef>& inputs, Loc where) {
  const Mesh* first = nullptr;
  bool any_local = false, any_global = false;
  for (const auto& in : inputs) {
    any_local |= in->local;
    any_global |= !in->local && in->mesh.is_valid();
  }
  if (any_local && any_global)
    throw LayoutError(std::string(op) + ": mixes a local value (inside a local_map'ed function) with a global tensor; "
                      "pass the global tensor to the function as an argument" + at_line(where));
  for (const auto& in : inputs) {
    if (!in->mesh.is_valid()) continue;
    if (!first) first = &in->mesh;
    else if (!(in->mesh == *first))
      throw LayoutError(std::string(op) + ": operands live on mismatched meshes " + first->to_string() + " and " +
                        in->mesh.to_string() + at_line(where));
  }
}

}  // namespace detail

namespace {

[[noreturn]] void shape_error(std::string_view op, const std::string& what, Loc where) {
  throw ShapeError(std::string(op) + ": " + what + at_line(where));
}

NodeRef node(OpKind op, DType dtype, std::vector<int64_t> shape, std::vector<NodeRef> inputs, NodeAttrs attrs, Loc where) {
  detail::check_meshes(op_name(op), inputs, where);
  return make_node(op, dtype, std::move(shape), std::move(inputs), std::move(attrs), where);
}

NodeRef scalar_node(double value, DType dtype, Loc where) {
  NodeAttrs attrs;
  attrs.scalar = value;
  return make_node(OpKind::Full, dtype, {}, {}, attrs, where);
}

int64_t normalize_axis(std::string_view op, int64_t axis, int64_t rank, Loc where) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    shape_error(op, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank), where);
  return a;
}

std::vector<int64_t> normalize_axes(std::string_view op, std::vector<int64_t> axes, int64_t rank, Loc where) {
  if (axes.empty()) {
    axes.resize(rank);
    std::iota(axes.begin(), axes.end(), 0);
    return axes;
  }
  for (int64_t& a : axes) a = normalize_axis(op, a, rank, where);
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    shape_error(op, "an axis is listed twice", where);
  return axes;
}

NodeRef reshape_node(const NodeRef& x, std::vector<int64_t> shape, Loc where) {
  if (x->shape == shape) return x;
  return node(OpKind::Reshape, x->dtype, std::move(shape), {x}, {}, where);
}

// numpy broadcasting of x to `shape` (rank alignment by reshape, then expand). `extents`: the
// uneven block extents of the operands it is broadcast against, inside local_map.
NodeRef broadcast_node(std::string_view op, const NodeRef& x, const std::vector<int64_t>& shape, Loc where,
                       const std::optional<BlockExtents>& extents = std::nullopt) {
  if (x->shape == shape) return x;
  if (x->rank() > int64_t(shape.size()))
    shape_error(op, "cannot broadcast shape " + shape_string(x->shape) + " to " + shape_string(shape), where);
  std::vector<int64_t> aligned(shape.size() - x->shape.size(), 1);
  aligned.insert(aligned.end(), x->shape.begin(), x->shape.end());
  for (size_t a = 0; a < shape.size(); ++a)
    if (aligned[a] != shape[a] && aligned[a] != 1)
      shape_error(op, "cannot broadcast shape " + shape_string(x->shape) + " to " + shape_string(shape), where);
  NodeRef r = reshape_node(x, aligned, where);
  if (aligned == shape) return r;
  NodeAttrs attrs;
  if (extents)
    for (size_t a = 0; a < shape.size(); ++a)
      if (aligned[a] != shape[a] && !extents->axes[a].is_constant()) attrs.extents = extents;
  return node(OpKind::Expand, x->dtype, shape, {r}, std::move(attrs), where);
}

std::vector<int64_t> broadcast_shapes(std::string_view op, const std::vector<std::vector<int64_t>>& shapes, Loc where) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes)
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[rank - s.size() + i];
      int64_t e = s[i];
      if (o == 1) o = e;
      else if (e != 1 && e != o) {
        std::string list = join(shapes, " and ", [](const std::vector<int64_t>& v) { return shape_string(v); });
        shape_error(op, "shapes " + list + " cannot broadcast", where);
      }
    }
  return out;
}

// PyTorch's promotion of two floating dtypes: the wider one; bf16 with f16 is f32 (neither holds
// the other). std::nullopt when either is not floating: integers and floats do not mix silently.
std::optional<DType> promoted_floating(DType a, DType b) {
  if (!is_floating(a) || !is_floating(b)) return std::nullopt;
  if (a == b) return a;
  if (a == DType::f64 || b == DType::f64) return DType::f64;
  return DType::f32;  // f32 with a 16-bit float, or bf16 with f16
}

// Lowers operands to nodes of one dtype (scalars adopt the tensors' dtype; floating tensors of
// different widths are cast to the wider, as PyTorch promotes a bf16 x f32 product to f32) and
// one shape.
std::vector<NodeRef> elementwise_operands(std::string_view op, const std::vector<const Operand*>& operands, Loc where,
                                          std::optional<DType> force_dtype = std::nullopt) {
  std::optional<DType> dtype = force_dtype;
  for (const Operand* o : operands)
    if (o->tensor) {
      DType d = o->tensor->dtype();
      if (!dtype) dtype = d;
      else if (*dtype != d && !force_dtype) {
        const std::optional<DType> wider = promoted_floating(*dtype, d);
        if (!wider)
          throw DTypeError(std::string(op) + ": operands have different dtypes " + std::string(dtype_name(*dtype)) + " and " +
                           std::string(dtype_name(d)) + "; cast one first" + at_line(where));
        dtype = wider;
      }
    }
  if (!dtype) throw DTypeError(std::string(op) + ": needs at least one tensor operand" + at_line(where));
  std::vector<NodeRef> nodes;
  std::vector<std::vector<int64_t>> shapes;
  for (const Operand* o : operands) {
    if (o->tensor && o->tensor->dtype() != *dtype && !force_dtype) {
      nodes.push_back(cast(*o->tensor, *dtype, where).node());
      shapes.push_back(nodes.back()->shape);
      continue;
    }
    nodes.push_back(o->tensor ? o->tensor->node() : scalar_node(o->scalar, *dtype, where));
    shapes.push_back(nodes.back()->shape);
  }
  std::vector<int64_t> shape = broadcast_shapes(op, shapes, where);
  const std::optional<BlockExtents> extents = broadcast_extents(nodes, shape);
  for (auto& n : nodes) n = broadcast_node(op, n, shape, where, extents);
  return nodes;
}

Tensor binary(OpKind op, const Operand& a, const Operand& b) {
  Loc where = a.tensor ? a.where : b.where;
  auto nodes = elementwise_operands(op_name(op), {&a, &b}, where);
  DType out = op_category(op) == OpCategory::Compare ? DType::u8 : nodes[0]->dtype;
  return Tensor(node(op, out, nodes[0]->shape, nodes, {}, where));
}

Tensor unary_op(OpKind op, const Tensor& x, Loc where) {
  const NodeRef& n = x.node();
  if ((op == OpKind::Exp || op == OpKind::Log || op == OpKind::Sqrt || op == OpKind::Tanh || op == OpKind::Sin ||
       op == OpKind::Cos) && !is_floating(n->dtype))
    throw DTypeError(std::string(op_name(op)) + ": needs a floating tensor, got " + std::string(dtype_name(n->dtype)) + at_line(where));
  return Tensor(node(op, n->dtype, n->shape, {n}, {}, where));
}

Tensor reduce_op(OpKind op, const Tensor& x, std::vector<int64_t> axes, bool keepdims, Loc where) {
  const NodeRef& n = x.node();
  std::vector<int64_t> shape, kept_shape = n->shape;
  for (int64_t a = 0; a < n->rank(); ++a)
    if (!std::binary_search(axes.begin(), axes.end(), a)) shape.push_back(n->shape[a]);
  for (int64_t a : axes) kept_shape[a] = 1;
  NodeAttrs attrs;
  attrs.axes = axes;
  NodeRef r = node(op, op == OpKind::ArgMax ? DType::i64 : n->dtype, shape, {n}, attrs, where);
  return Tensor(keepdims ? reshape_node(r, kept_shape, where) : r);
}

// The op as built by `build`, under a strategy registered for `name` when there is one.
// (A template, so the common case, nothing registered, allocates nothing.)
template <class Build>
Tensor registered(std::string_view name, std::initializer_list<Tensor> inputs, const std::vector<int64_t>& axes, Loc where,
                  const Build& build) {
  if (!detail::any_registered_sharding()) return build(std::span<const Tensor>(inputs.begin(), inputs.size()));
  return detail::with_registered_sharding(name, std::vector<Tensor>(inputs), axes,
                                          [&](const std::vector<Tensor>& placed) { return build(std::span<const Tensor>(placed)); },
                                          where);
}

Tensor softmax_op(const Tensor& logits, int64_t axis, Loc where);
Tensor log_softmax_op(const Tensor& logits, int64_t axis, Loc where);
Tensor matmul_op(const Tensor& a, const Tensor& b, Loc where);

Tensor unary(OpKind op, const Tensor& x, Loc where) {
  return registered(op_name(op), {x}, {}, where, [&](std::span<const Tensor> in) { return unary_op(op, in[0], where); });
}

Tensor reduce(OpKind op, std::string_view name, const Tensor& x, std::vector<int64_t> axes, bool keepdims, Loc where) {
  axes = normalize_axes(name, std::move(axes), x.rank(), where);
  return registered(name, {x}, axes, where,
                    [&](std::span<const Tensor> in) { return reduce_op(op, in[0], axes, keepdims, where); });
}

Tensor source(OpKind op, std::vector<int64_t> shape, DType dtype, const Layout& layout, NodeAttrs attrs,
              std::string_view name, Loc where) {
  if (int64_t(shape.size()) != layout.rank())
    throw LayoutError(std::string(name) + ": shape " + shape_string(shape) + " (rank " + std::to_string(shape.size()) +
                      ") does not match the rank-" + std::to_string(layout.rank()) + " layout" + at_line(where));
  for (int64_t e : shape)
    if (e < 0) shape_error(name, "shape " + shape_string(shape) + " has a negative extent", where);
  attrs.layout = layout;
  return Tensor(node(op, dtype, std::move(shape), {}, std::move(attrs), where));
}

}  // namespace

Operand::Operand(const Variable& v, Loc where) : tensor(v.value()), where(where) {}

Tensor add(const Operand& a, const Operand& b) { return binary(OpKind::Add, a, b); }
Tensor sub(const Operand& a, const Operand& b) { return binary(OpKind::Sub, a, b); }
Tensor mul(const Operand& a, const Operand& b) { return binary(OpKind::Mul, a, b); }
Tensor div(const Operand& a, const Operand& b) { return binary(OpKind::Div, a, b); }
Tensor maximum(const Operand& a, const Operand& b) { return binary(OpKind::Maximum, a, b); }
Tensor minimum(const Operand& a, const Operand& b) { return binary(OpKind::Minimum, a, b); }
Tensor pow(const Operand& a, const Operand& b) { return binary(OpKind::Pow, a, b); }
Tensor operator+(const Operand& a, const Operand& b) { return binary(OpKind::Add, a, b); }
Tensor operator-(const Operand& a, const Operand& b) { return binary(OpKind::Sub, a, b); }
Tensor operator*(const Operand& a, const Operand& b) { return binary(OpKind::Mul, a, b); }
Tensor operator/(const Operand& a, const Operand& b) { return binary(OpKind::Div, a, b); }
Tensor operator-(const Operand& a) {
  if (!a.tensor) throw DTypeError("neg: needs a tensor operand" + at_line(a.where));
  return unary(OpKind::Neg, *a.tensor, a.where);
}
Tensor operator==(const Operand& a, const Operand& b) { return binary(OpKind::Equal, a, b); }
Tensor operator!=(const Operand& a, const Operand& b) { return binary(OpKind::NotEqual, a, b); }
Tensor operator<(const Operand& a, const Operand& b) { return binary(OpKind::Less, a, b); }
Tensor operator<=(const Operand& a, const Operand& b) { return binary(OpKind::LessEqual, a, b); }
Tensor operator>(const Operand& a, const Operand& b) { return binary(OpKind::Less, b, a); }
Tensor operator>=(const Operand& a, const Operand& b) { return binary(OpKind::LessEqual, b, a); }

Tensor where(const Tensor& condition, const Operand& a, const Operand& b, Loc loc) {
  if (condition.dtype() != DType::u8)
    throw DTypeError("where: the condition must be bool, got " + std::string(dtype_name(condition.dtype())) + at_line(loc));
  // Two scalars take PyTorch's default dtypes: int64 when both are integers, default_dtype() otherwise.
  std::optional<DType> scalars_dtype;
  if (!a.tensor && !b.tensor) scalars_dtype = a.integral && b.integral ? DType::i64 : default_dtype();
  auto values = elementwise_operands("where", {&a, &b}, loc, scalars_dtype);
  std::vector<int64_t> shape = broadcast_shapes("where", {condition.shape(), values[0]->shape}, loc);
  const std::optional<BlockExtents> extents = broadcast_extents({condition.node(), values[0], values[1]}, shape);
  NodeRef c = broadcast_node("where", condition.node(), shape, loc, extents);
  return Tensor(node(OpKind::Where, values[0]->dtype, shape,
                     {c, broadcast_node("where", values[0], shape, loc, extents), broadcast_node("where", values[1], shape, loc, extents)},
                     {}, loc));
}

Tensor stop_gradient(const Tensor& x, Loc where) { return Tensor(node(OpKind::StopGradient, x.dtype(), x.shape(), {x.node()}, {}, where)); }

namespace detail {
Tensor reduce_partials(const Tensor& x, Loc where) {
  return Tensor(node(OpKind::ReducePartials, x.dtype(), x.shape(), {x.node()}, {}, where));
}
}  // namespace detail

Tensor cast(const Tensor& x, DType dtype, Loc where) {
  if (x.dtype() == dtype) return x;
  return Tensor(node(OpKind::Cast, dtype, x.shape(), {x.node()}, {}, where));
}

Tensor neg(const Tensor& x, Loc where) { return unary(OpKind::Neg, x, where); }
Tensor abs(const Tensor& x, Loc where) { return unary(OpKind::Abs, x, where); }
Tensor exp(const Tensor& x, Loc where) { return unary(OpKind::Exp, x, where); }
Tensor log(const Tensor& x, Loc where) { return unary(OpKind::Log, x, where); }
Tensor sqrt(const Tensor& x, Loc where) { return unary(OpKind::Sqrt, x, where); }
Tensor tanh(const Tensor& x, Loc where) { return unary(OpKind::Tanh, x, where); }
Tensor sin(const Tensor& x, Loc where) { return unary(OpKind::Sin, x, where); }
Tensor cos(const Tensor& x, Loc where) { return unary(OpKind::Cos, x, where); }
Tensor rsqrt(const Tensor& x, Loc where) { return div(Operand(1.0, where), Operand(sqrt(x, where), where)); }
Tensor square(const Tensor& x, Loc where) { return mul(Operand(x, where), Operand(x, where)); }
Tensor relu(const Tensor& x, Loc where) { return maximum(Operand(x, where), Operand(0.0, where)); }
Tensor sigmoid(const Tensor& x, Loc where) {
  // 1 / (1 + exp(-x)): exp overflows to inf for very negative x, giving exactly 0.
  return div(Operand(1.0, where), Operand(add(Operand(1.0, where), Operand(exp(neg(x, where), where), where)), where));
}

DType sum_dtype(DType dtype) { return is_floating(dtype) ? dtype : DType::i64; }

Tensor reduce_sum(const Tensor& x, std::vector<int64_t> axes, bool keepdims, Loc where) {
  // Bool and narrow integers accumulate in i64, as numpy's and PyTorch's sums do: 300 trues sum
  // to 300, not to 300 mod 256.
  return reduce(OpKind::ReduceSum, "reduce_sum", cast(x, sum_dtype(x.dtype()), where), std::move(axes), keepdims, where);
}
Tensor reduce_max(const Tensor& x, std::vector<int64_t> axes, bool keepdims, Loc where) {
  return reduce(OpKind::ReduceMax, "reduce_max", x, std::move(axes), keepdims, where);
}
Tensor reduce_min(const Tensor& x, std::vector<int64_t> axes, bool keepdims, Loc where) {
  return reduce(OpKind::ReduceMin, "reduce_min", x, std::move(axes), keepdims, where);
}
Tensor reduce_prod(const Tensor& x, std::vector<int64_t> axes, bool keepdims, Loc where) {
  return reduce(OpKind::ReduceProd, "reduce_prod", x, std::move(axes), keepdims, where);
}
Tensor reduce_mean(const Tensor& x, std::vector<int64_t> axes, bool keepdims, Loc where) {
  std::vector<int64_t> normalized = normalize_axes("reduce_mean", axes, x.rank(), where);
  int64_t count = 1;
  for (int64_t a : normalized) count *= x.shape()[a];
  Tensor sum = reduce_sum(x, normalized, keepdims, where);
  // The global count: every device scales its partial sum by the same 1/n (exact for uneven shards).
  if (is_floating(x.dtype())) return mul(Operand(sum, where), Operand(1.0 / double(count), where));
  return cast(div(Operand(sum, where), Operand(double(count), where)), x.dtype(), where);  // the sum's i64 is internal
}
Tensor argmax(const Tensor& x, int64_t axis, Loc where) {
  const int64_t a = normalize_axis("argmax", axis, x.rank(), where);
  if (x.shape()[size_t(a)] == 0) shape_error("argmax", "axis " + std::to_string(axis) + " of shape " + shape_string(x.shape()) + " is empty", where);
  return reduce(OpKind::ArgMax, "argmax", x, {a}, false, where);
}

Tensor softmax(const Tensor& logits, int64_t axis, Loc where) {
  axis = normalize_axis("softmax", axis, logits.rank(), where);
  return registered("softmax", {logits}, {axis}, where, [&](std::span<const Tensor> in) { return softmax_op(in[0], axis, where); });
}

Tensor log_softmax(const Tensor& logits, int64_t axis, Loc where) {
  axis = normalize_axis("log_softmax", axis, logits.rank(), where);
  return registered("log_softmax", {logits}, {axis}, where,
                    [&](std::span<const Tensor> in) { return log_softmax_op(in[0], axis, where); });
}

namespace {
Tensor softmax_op(const Tensor& logits, int64_t axis, Loc where) {
  Tensor shifted = sub(Operand(logits, where), Operand(reduce_max(logits, {axis}, true, where), where));
  Tensor e = exp(shifted, where);
  return div(Operand(e, where), Operand(reduce_sum(e, {axis}, true, where), where));
}
}  // namespace

namespace {
Tensor log_softmax_op(const Tensor& logits, int64_t axis, Loc where) {
  Tensor shifted = sub(Operand(logits, where), Operand(reduce_max(logits, {axis}, true, where), where));
  Tensor lse = log(reduce_sum(exp(shifted, where), {axis}, true, where), where);
  return sub(Operand(shifted, where), Operand(lse, where));
}
}  // namespace

Tensor one_hot(const Tensor& indices, int64_t depth, DType dtype, Loc where) {
  if (indices.dtype() != DType::i32 && indices.dtype() != DType::i64)
    throw DTypeError("one_hot: indices must be int32 or int64, got " + std::string(dtype_name(indices.dtype())) + at_line(where));
  if (depth < 0) shape_error("one_hot", "depth " + std::to_string(depth) + " is negative", where);
  if (indices.dtype() == DType::i32 && depth > std::numeric_limits<int32_t>::max())
    shape_error("one_hot", "depth " + std::to_string(depth) + " does not fit the int32 indices; cast them to int64", where);
  std::vector<int64_t> shape = indices.shape();
  shape.push_back(depth);
  // The class ids: an iota with no layout of its own, so it takes the layout its consumer needs.
  NodeAttrs attrs;
  attrs.axes = {int64_t(shape.size()) - 1};
  NodeRef classes = make_node(OpKind::Iota, indices.dtype(), shape, {}, attrs, where);
  Tensor hit = Tensor(classes) == Operand(expand_dims(indices, -1, where), where);
  return cast(hit, dtype, where);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, Loc where) {
  return reduce_mean(sparse_softmax_cross_entropy_with_logits(labels, logits, where), {}, false, where);
}

Tensor sparse_softmax_cross_entropy_with_logits(const Tensor& labels, const Tensor& logits, Loc where) {
  if (logits.rank() != labels.rank() + 1)
    shape_error("sparse_softmax_cross_entropy_with_logits",
                "logits " + shape_string(logits.shape()) + " must have one more axis than labels " + shape_string(labels.shape()), where);
  for (int64_t a = 0; a < labels.rank(); ++a)
    if (labels.shape()[a] != logits.shape()[a])
      shape_error("sparse_softmax_cross_entropy_with_logits",
                  "labels " + shape_string(labels.shape()) + " do not match logits " + shape_string(logits.shape()), where);
  const int64_t classes = logits.shape().back();
  // A label outside [0, classes) stops the step with an IndexError (as TensorFlow's CPU kernels do).
  const Tensor checked = check_index(labels, 0, classes, IndexUse::Label, where);
  Tensor picked = mul(Operand(one_hot(checked, classes, logits.dtype(), where), where),
                      Operand(log_softmax(logits, -1, where), where));
  return neg(reduce_sum(picked, {-1}, false, where), where);
}

Tensor matmul(const Tensor& a, const Tensor& b, Loc where) {
  return registered("matmul", {a, b}, {}, where, [&](std::span<const Tensor> in) { return matmul_op(in[0], in[1], where); });
}

namespace {
Tensor matmul_op(const Tensor& a, const Tensor& b, Loc where) {
  const NodeRef &na = a.node(), &nb = b.node();
  if (na->rank() < 2 || nb->rank() < 2)
    shape_error("matmul", "operands need rank >= 2, got " + shape_string(na->shape) + " and " + shape_string(nb->shape), where);
  if (na->dtype != nb->dtype)
    throw DTypeError("matmul: operands have different dtypes " + std::string(dtype_name(na->dtype)) + " and " +
                     std::string(dtype_name(nb->dtype)) + at_line(where));
  if (na->dtype == DType::u8) throw DTypeError("matmul: bool operands are not supported" + at_line(where));
  int64_t k = na->shape.back();
  if (nb->shape[nb->rank() - 2] != k)
    shape_error("matmul", "inner dimensions differ: " + shape_string(na->shape) + " x " + shape_string(nb->shape), where);
  std::vector<int64_t> batch_a(na->shape.begin(), na->shape.end() - 2), batch_b(nb->shape.begin(), nb->shape.end() - 2);
  if (batch_b.empty() && !batch_a.empty() && !na->extents && !nb->extents) {
    // [..., m, k] x [k, n] as one GEMM over all of a's rows, as torch.matmul folds it (a batch
    // reading a broadcast copy of b, and b's gradient summed over per-batch products, took 16
    // GEMMs, 16 copies and a reduce), but without reshaping a to [rows, k]: a Rows dot keeps
    // a's leading axes, so rows sharded along any of them stay where they are
    // (dsl/dot_form.hpp).
    std::vector<int64_t> shape = na->shape;
    shape.back() = nb->shape.back();
    return Tensor(node(OpKind::Dot, na->dtype, shape, {na, nb}, {}, where));
  }
  std::vector<int64_t> batch = broadcast_shapes("matmul", {batch_a, batch_b}, where);
  auto full_shape = [&](const NodeRef& n) {
    std::vector<int64_t> s = batch;
    s.push_back(n->shape[n->rank() - 2]);
    s.push_back(n->shape.back());
    return s;
  };
  // Inside local_map, a batch axis broadcast against uneven blocks takes their extents.
  auto full_extents = [&](const NodeRef& n) -> std::optional<BlockExtents> {
    const NodeRef& other = n == na ? nb : na;
    if (!other->extents) return std::nullopt;
    BlockExtents e = constant_extents(other->extents->mesh, full_shape(n));
    const size_t lead = batch.size() - size_t(other->rank() - 2);
    for (size_t a = 0; a + 2 < size_t(other->rank()); ++a) e.axes[lead + a] = other->extents->axes[a];
    return e;
  };
  NodeRef ba = broadcast_node("matmul", na, full_shape(na), where, full_extents(na));
  NodeRef bb = broadcast_node("matmul", nb, full_shape(nb), where, full_extents(nb));
  std::vector<int64_t> shape = batch;
  shape.push_back(na->shape[na->rank() - 2]);
  shape.push_back(nb->shape.back());
  return Tensor(node(OpKind::Dot, na->dtype, shape, {ba, bb}, {}, where));
}
}  // namespace

Tensor reshape(const Tensor& x, std::vector<int64_t> shape, Loc where) {
  int64_t known = 1, unknown = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (unknown >= 0) shape_error("reshape", "more than one -1 in " + shape_string(shape), where);
      unknown = int64_t(i);
    } else if (shape[i] < 0) {
      shape_error("reshape", "negative extent in " + shape_string(shape), where);
    }
  }
  std::vector<int64_t> known_extents;
  for (int64_t e : shape)
    if (e != -1) known_extents.push_back(e);
  known = checked_element_count(known_extents, "reshape");
  const int64_t n = x.node()->numel();
  if (unknown >= 0) {
    if (known == 0 || n % known != 0)
      shape_error("reshape", "cannot reshape " + shape_string(x.shape()) + " into " + shape_string(shape), where);
    shape[unknown] = n / known;
    known *= shape[unknown];
  }
  if (known != n) shape_error("reshape", "cannot reshape " + shape_string(x.shape()) + " (" + std::to_string(n) +
                                             " elements) into " + shape_string(shape), where);
  detail::check_meshes("reshape", {x.node()}, where);
  return Tensor(reshape_node(x.node(), shape, where));
}

Tensor transpose(const Tensor& x, std::vector<int64_t> perm, Loc where) {
  const int64_t rank = x.rank();
  if (perm.empty())
    for (int64_t a = rank - 1; a >= 0; --a) perm.push_back(a);
  if (int64_t(perm.size()) != rank)
    shape_error("transpose", "permutation of " + std::to_string(perm.size()) + " axes for rank " + std::to_string(rank), where);
  std::vector<bool> seen(rank, false);
  std::vector<int64_t> shape;
  for (int64_t& p : perm) {
    p = normalize_axis("transpose", p, rank, where);
    if (seen[p]) shape_error("transpose", "axis " + std::to_string(p) + " appears twice in the permutation", where);
    seen[p] = true;
    shape.push_back(x.shape()[p]);
  }
  bool identity = true;
  for (int64_t a = 0; a < rank; ++a) identity &= perm[a] == a;
  if (identity) return x;
  NodeAttrs attrs;
  attrs.axes = perm;
  return Tensor(node(OpKind::Permute, x.dtype(), shape, {x.node()}, attrs, where));
}

Tensor broadcast_to(const Tensor& x, std::vector<int64_t> shape, Loc where) {
  return Tensor(broadcast_node("broadcast_to", x.node(), shape, where));
}

namespace detail {
Tensor broadcast_like(const Tensor& x, const NodeRef& like, Loc where) {
  return Tensor(broadcast_node("broadcast_to", x.node(), like->shape, where, like->extents));
}

Tensor contract_rows(const Tensor& a, const Tensor& b, Loc where) {
  const NodeRef &na = a.node(), &nb = b.node();
  if (na->rank() < 3 || nb->rank() != na->rank() ||
      !std::equal(na->shape.begin(), na->shape.end() - 1, nb->shape.begin(), nb->shape.end() - 1))
    shape_error("contract_rows", "operands need the same leading axes and rank >= 3, got " + shape_string(na->shape) +
                                     " and " + shape_string(nb->shape), where);
  return Tensor(node(OpKind::Dot, na->dtype, {na->shape.back(), nb->shape.back()}, {na, nb}, {}, where));
}

Tensor transpose_last_two(const Tensor& x, Loc where) {
  std::vector<int64_t> perm(size_t(x.rank()));
  for (size_t d = 0; d < perm.size(); ++d) perm[d] = int64_t(d);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return transpose(x, perm, where);
}
}  // namespace detail

Tensor expand_dims(const Tensor& x, int64_t axis, Loc where) {
  const int64_t rank = x.rank();
  int64_t a = normalize_axis("expand_dims", axis < 0 ? axis + rank + 1 : axis, rank + 1, where);
  std::vector<int64_t> shape = x.shape();
  shape.insert(shape.begin() + a, 1);
  return Tensor(reshape_node(x.node(), shape, where));
}

Tensor squeeze(const Tensor& x, std::vector<int64_t> axes, Loc where) {
  std::vector<int64_t> shape;
  if (axes.empty()) {
    for (int64_t e : x.shape())
      if (e != 1) shape.push_back(e);
  } else {
    axes = normalize_axes("squeeze", axes, x.rank(), where);
    for (int64_t a = 0; a < x.rank(); ++a) {
      bool drop = std::binary_search(axes.begin(), axes.end(), a);
      if (drop && x.shape()[a] != 1)
        shape_error("squeeze", "axis " + std::to_string(a) + " of shape " + shape_string(x.shape()) + " is not 1", where);
      if (!drop) shape.push_back(x.shape()[a]);
    }
  }
  return Tensor(reshape_node(x.node(), shape, where));
}

Tensor slice(const Tensor& x, std::vector<int64_t> begin, std::vector<int64_t> size, Loc where) {
  const int64_t rank = x.rank();
  if (int64_t(begin.size()) != rank || int64_t(size.size()) != rank)
    shape_error("slice", "begin and size need " + std::to_string(rank) + " entries for shape " + shape_string(x.shape()), where);
  std::vector<int64_t> shape(rank);
  for (int64_t a = 0; a < rank; ++a) {
    int64_t n = x.shape()[a];
    if (size[a] == -1) size[a] = n - begin[a];
    if (begin[a] < 0 || size[a] < 0 || begin[a] > n || size[a] > n - begin[a])  // (no overflow)
      shape_error("slice", "begin " + std::to_string(begin[a]) + " size " + std::to_string(size[a]) + " is outside axis " +
                               std::to_string(a) + " of shape " + shape_string(x.shape()), where);
    shape[a] = size[a];
  }
  if (shape == x.shape()) return x;
  NodeAttrs attrs;
  attrs.lo = begin;
  return Tensor(node(OpKind::Slice, x.dtype(), shape, {x.node()}, attrs, where));
}

Tensor pad(const Tensor& x, std::vector<std::pair<int64_t, int64_t>> paddings, double value, Loc where) {
  if (int64_t(paddings.size()) != x.rank())
    shape_error("pad", std::to_string(paddings.size()) + " paddings for shape " + shape_string(x.shape()), where);
  NodeAttrs attrs;
  attrs.scalar = value;
  std::vector<int64_t> shape = x.shape();
  for (int64_t a = 0; a < x.rank(); ++a) {
    if (paddings[a].first < 0 || paddings[a].second < 0) shape_error("pad", "negative padding on axis " + std::to_string(a), where);
    if (paddings[a].first > kMaxElements || paddings[a].second > kMaxElements)
      shape_error("pad", "padding on axis " + std::to_string(a) + " is larger than any tensor may be", where);
    attrs.lo.push_back(paddings[a].first);
    attrs.hi.push_back(paddings[a].second);
    shape[a] += paddings[a].first + paddings[a].second;
  }
  if (shape == x.shape()) return x;
  return Tensor(node(OpKind::Pad, x.dtype(), shape, {x.node()}, attrs, where));
}

Tensor concat(const std::vector<Tensor>& xs, int64_t axis, Loc where) {
  if (xs.empty()) shape_error("concat", "no tensors to concatenate", where);
  const int64_t rank = xs[0].rank();
  int64_t a = normalize_axis("concat", axis, rank, where);
  std::vector<int64_t> shape = xs[0].shape();
  shape[a] = 0;
  std::vector<NodeRef> inputs;
  for (const Tensor& x : xs) {
    if (x.rank() != rank || x.dtype() != xs[0].dtype())
      throw ShapeError("concat: tensor of shape " + shape_string(x.shape()) + " and dtype " + std::string(dtype_name(x.dtype())) +
                       " does not match " + shape_string(xs[0].shape()) + " " + std::string(dtype_name(xs[0].dtype())) + at_line(where));
    for (int64_t d = 0; d < rank; ++d)
      if (d != a && x.shape()[d] != xs[0].shape()[d])
        shape_error("concat", "shapes " + shape_string(xs[0].shape()) + " and " + shape_string(x.shape()) +
                                  " differ off the concat axis", where);
    shape[a] += x.shape()[a];
    inputs.push_back(x.node());
  }
  if (inputs.size() == 1) return xs[0];
  NodeAttrs attrs;
  attrs.axes = {a};
  return Tensor(node(OpKind::Concat, xs[0].dtype(), shape, inputs, attrs, where));
}

Tensor with_layout(const Tensor& x, Layout layout, Loc where) { return with_layout(x, std::move(layout), std::nullopt, where); }

Tensor with_layout(const Tensor& x, Layout layout, std::optional<Layout> grad_layout, Loc where) {
  return with_layout(x, std::move(layout), std::move(grad_layout), std::nullopt, where);
}

Tensor with_layout(const Tensor& x, Layout layout, std::optional<Layout> grad_layout, std::optional<DType> grad_dtype,
                   Loc where) {
  if (grad_dtype && (!is_floating(*grad_dtype) || !is_floating(x.dtype())))
    throw DTypeError("with_layout: a gradient dtype (" + std::string(dtype_name(*grad_dtype)) +
                     ") needs a floating tensor and a floating dtype; the tensor is " + std::string(dtype_name(x.dtype())) +
                     at_line(where));
  if (x.node()->local)
    throw LayoutError("with_layout: a local value (inside a local_map'ed function) has no layout; use the functional "
                      "collectives to move it" + at_line(where));
  for (const Layout* l : {&layout, grad_layout ? &*grad_layout : nullptr}) {
    if (!l) continue;
    const char* what = l == &layout ? "layout" : "gradient layout";
    if (l->rank() != x.rank())
      throw LayoutError("with_layout: a tensor of shape " + shape_string(x.shape()) + " cannot take a rank-" +
                        std::to_string(l->rank()) + " " + what + at_line(where));
    if (x.node()->mesh.is_valid() && !(x.node()->mesh == l->mesh()))
      throw LayoutError(std::string("with_layout: the ") + what + "'s mesh " + l->mesh().to_string() + " differs from the tensor's " +
                        x.node()->mesh.to_string() + " (mismatched meshes)" + at_line(where));
  }
  NodeAttrs attrs;
  attrs.layout = std::move(layout);
  attrs.grad_layout = std::move(grad_layout);
  if (grad_dtype != x.dtype()) attrs.grad_dtype = grad_dtype;
  return Tensor(node(OpKind::WithLayout, x.dtype(), x.shape(), {x.node()}, attrs, where));
}

Tensor iota(std::vector<int64_t> shape, int64_t axis, Layout layout, DType dtype, Loc where) {
  return tagged_iota(std::move(shape), axis, std::move(layout), 0, dtype, where);
}

Tensor tagged_iota(std::vector<int64_t> shape, int64_t axis, Layout layout, int64_t tag, DType dtype, Loc where) {
  NodeAttrs attrs;
  attrs.axes = {normalize_axis("iota", axis, int64_t(shape.size()), where)};
  attrs.tag = tag;
  return source(OpKind::Iota, std::move(shape), dtype, layout, attrs, "iota", where);
}

namespace {

// Counter-based random source: seed and the distribution's two parameters.
Tensor random_source(OpKind op, std::string_view name, std::vector<int64_t> shape, uint64_t seed, Layout layout, double a,
                     double b, DType dtype, Loc where) {
  if (!is_floating(dtype)) throw DTypeError(std::string(name) + ": dtype must be floating" + at_line(where));
  NodeAttrs attrs;
  attrs.seed = seed;
  attrs.scalar = a;
  attrs.scalar2 = b;
  return source(op, std::move(shape), dtype, layout, attrs, name, where);
}

}  // namespace

Tensor random_uniform(std::vector<int64_t> shape, uint64_t seed, Layout layout, double minval, double maxval, DType dtype,
                      Loc where) {
  if (dtype == DType::i32 || dtype == DType::i64) {
    // Integers in [minval, maxval) (torch.randint): minval + the whole part of a uniform draw in
    // [0, maxval - minval), from the same counter-based stream, so the same on every layout.
    const int64_t low = int64_t(std::ceil(minval)), high = int64_t(std::ceil(maxval));
    if (high <= low)
      throw ShapeError("random_uniform: the integer range [" + std::to_string(low) + ", " + std::to_string(high) + ") is empty" +
                       at_line(where));
    Tensor u = random_source(OpKind::RandomUniform, "random_uniform", std::move(shape), seed, std::move(layout), 0,
                             double(high - low), DType::f64, where);
    Tensor drawn = minimum(Operand(cast(u, DType::i64, where), where), Operand(high - low - 1, where));  // rounding never reaches high
    return cast(add(Operand(drawn, where), Operand(low, where)), dtype, where);
  }
  return random_source(OpKind::RandomUniform, "random_uniform", std::move(shape), seed, std::move(layout), minval, maxval,
                       dtype, where);
}

Tensor random_normal(std::vector<int64_t> shape, uint64_t seed, Layout layout, double mean, double stddev, DType dtype,
                     Loc where) {
  return random_source(OpKind::RandomNormal, "random_normal", std::move(shape), seed, std::move(layout), mean, stddev, dtype,
                       where);
}

namespace {

// Errors name the factory the user called.
Tensor filled(std::string_view name, std::vector<int64_t> shape, double value, const Layout& layout, DType dtype, Loc where,
              int64_t tag = 0) {
  NodeAttrs attrs;
  attrs.scalar = value;
  attrs.tag = tag;
  return source(OpKind::Full, std::move(shape), dtype, layout, attrs, name, where);
}

}  // namespace

Tensor tagged_full(std::vector<int64_t> shape, double value, Layout layout, int64_t tag, DType dtype, Loc where) {
  return filled("full", std::move(shape), value, layout, dtype, where, tag);
}

Tensor full(std::vector<int64_t> shape, double value, Layout layout, DType dtype, Loc where) {
  return filled("full", std::move(shape), value, layout, dtype, where);
}
Tensor zeros(std::vector<int64_t> shape, Layout layout, DType dtype, Loc where) {
  return filled("zeros", std::move(shape), 0.0, layout, dtype, where);
}
Tensor ones(std::vector<int64_t> shape, Layout layout, DType dtype, Loc where) {
  return filled("ones", std::move(shape), 1.0, layout, dtype, where);
}
Tensor empty(std::vector<int64_t> shape, Layout layout, DType dtype, Loc where) {
  return filled("empty", std::move(shape), 0.0, layout, dtype, where);
}

}  // namespace tessera
