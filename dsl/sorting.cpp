#include "dsl/sorting.hpp"

#include "dsl/axes.hpp"
#include "dsl/error.hpp"
#include "dsl/node.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

Tensor to_last(const Tensor& x, int64_t axis, Loc at) { return axis == x.rank() - 1 ? x : transpose(x, axis_last(x.rank(), axis), at); }

Tensor from_last(const Tensor& x, int64_t axis, Loc at) {
  if (axis == x.rank() - 1) return x;
  return transpose(x, inverse_permutation(axis_last(x.rank(), axis)), at);
}

// 0, 1, .., n - 1 along `axis` of `rank` axes (default: the last; extent 1 elsewhere), with no
// layout of its own.
Tensor positions(int64_t n, int64_t rank, Loc at, int64_t axis = -1) {
  if (axis < 0) axis += rank;
  std::vector<int64_t> shape(size_t(rank), 1);
  shape[size_t(axis)] = n;
  NodeAttrs attrs;
  attrs.axes = {axis};
  return Tensor(make_node(OpKind::Iota, DType::i64, shape, {}, attrs, at));
}

Tensor as_i64(const Tensor& t, Loc at) { return cast(t, DType::i64, at); }
Tensor either(const Tensor& a, const Tensor& b, Loc at) { return maximum(as_i64(a, at), as_i64(b, at)); }
Tensor both(const Tensor& a, const Tensor& b, Loc at) { return mul(Operand(as_i64(a, at), at), Operand(as_i64(b, at), at)); }
Tensor is_nan(const Tensor& t, Loc at) { return Operand(t, at) != Operand(t, at); }

// rank[.., i]: how many elements of the last axis come before element i in sorted order.
Tensor ranks(const Tensor& x, bool descending, Loc at) {
  const int64_t r = x.rank() + 1;
  const Tensor xi = expand_dims(x, -1, at), xj = expand_dims(x, -2, at);  // [.., n, 1], [.., 1, n]
  // NaN is the largest value: ascending it comes last, descending first.
  const Tensor nan_i = is_nan(xi, at), nan_j = is_nan(xj, at);
  const Tensor j_first = descending ? either(xj > xi, both(nan_j, nan_i == 0, at) > 0, at)
                                    : either(xj < xi, both(nan_i, nan_j == 0, at) > 0, at);
  const Tensor same = either(xj == xi, both(nan_i, nan_j, at) > 0, at);
  const int64_t n = x.shape().back();
  const Tensor j_before_i = either(j_first > 0, both(same > 0, positions(n, r, at) < positions(n, r, at, -2), at) > 0, at);
  return reduce_sum(j_before_i, {r - 1}, false, at);
}

// out[.., p] = value[.., i] of the i whose rank is p, for each position p of the last axis.
Tensor place_by_rank(const Tensor& rank, const Tensor& value, Loc at) {
  const int64_t n = rank.shape().back(), r = rank.rank() + 1;
  const Tensor hit = expand_dims(rank, -1, at) == positions(n, r, at);  // [.., i, p]
  const Tensor zero(make_node(OpKind::Full, value.dtype(), {}, {}, {}, at));
  return reduce_sum(where(hit, expand_dims(value, -1, at), zero, at), {r - 2}, false, at);
}

}  // namespace

std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t axis, bool descending, Loc at) {
  const int64_t a = checked_axis("sort", axis, x.rank(), at);
  if (x.dtype() == DType::u8) throw DTypeError("sort: bool tensors are not supported; cast them first" + at_line(at));
  const Tensor last = to_last(x, a, at);
  const Tensor rank = ranks(last, descending, at);
  const Tensor index = broadcast_to(positions(last.shape().back(), last.rank(), at), last.shape(), at);
  return {from_last(place_by_rank(rank, last, at), a, at), from_last(place_by_rank(rank, index, at), a, at)};
}

Tensor argsort(const Tensor& x, int64_t axis, bool descending, Loc at) { return sort(x, axis, descending, at).second; }

std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t axis, Loc at) {
  const int64_t a = checked_axis("topk", axis, x.rank(), at);
  const int64_t n = x.shape()[size_t(a)];
  if (k < 0 || k > n)
    throw ShapeError("topk: k = " + std::to_string(k) + " is outside [0, " + std::to_string(n) + "] for axis " +
                     std::to_string(axis) + " of " + shape_string(x.shape()) + at_line(at));
  auto [values, indices] = sort(x, a, true, at);
  std::vector<int64_t> begin(size_t(x.rank()), 0), size = x.shape();
  size[size_t(a)] = k;
  return {slice(values, begin, size, at), slice(indices, begin, size, at)};
}

Tensor cumsum(const Tensor& x, int64_t axis, Loc at) {
  const int64_t a = checked_axis("cumsum", axis, x.rank(), at);
  const Tensor last = to_last(x, a, at);
  const int64_t n = last.shape().back(), r = last.rank() + 1;
  // Element i adds elements j <= i: a [.., i, j] mask over the row.
  const Tensor j_le_i = positions(n, r, at) <= positions(n, r, at, -2);
  const Tensor zero = Tensor(make_node(OpKind::Full, x.dtype(), {}, {}, {}, at));
  return from_last(reduce_sum(where(j_le_i, expand_dims(last, -2, at), zero, at), {r - 1}, false, at), a, at);
}

Tensor multinomial(const Tensor& probs, int64_t n, uint64_t seed, Loc at) {
  if (!is_floating(probs.dtype())) throw DTypeError("multinomial: probs must be floating, got " + std::string(dtype_name(probs.dtype())) + at_line(at));
  if (probs.rank() < 1 || probs.shape().back() == 0) throw ShapeError("multinomial: probs needs a non-empty last axis, got " + shape_string(probs.shape()) + at_line(at));
  if (n < 0) throw ShapeError("multinomial: n = " + std::to_string(n) + " is negative" + at_line(at));
  const Mesh mesh = probs.node()->mesh;
  if (!mesh.is_valid()) throw LayoutError("multinomial: probs has no mesh" + at_line(at));
  const int64_t v = probs.shape().back(), r = probs.rank();
  const Tensor cdf = cumsum(probs, -1, at);
  std::vector<int64_t> begin(size_t(r), 0), size = probs.shape();
  begin.back() = v - 1;
  size.back() = 1;
  const Tensor total = slice(cdf, begin, size, at);  // [.., 1]
  std::vector<int64_t> draws_shape = probs.shape();
  draws_shape.back() = n;
  // Draw d picks the first category whose running sum exceeds u * total: the count of those not exceeding it.
  const Tensor u = random_uniform(draws_shape, seed, Layout::replicated(mesh, r), 0, 1, probs.dtype(), at) * total;
  const Tensor below = cast(expand_dims(cdf, -2, at) <= expand_dims(u, -1, at), DType::i64, at);  // [.., n, V]
  return minimum(reduce_sum(below, {r}, false, at), int64_t(v - 1));
}

}  // namespace tessera
