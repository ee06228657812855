#include "dsl/attention.hpp"

#include <cmath>
#include <limits>

#include "dsl/error.hpp"
#include "dsl/node.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

// An iota along `axis` of `shape` with no layout of its own (it takes its consumer's).
Tensor free_iota(const std::vector<int64_t>& shape, int64_t axis, Loc at) {
  NodeAttrs attrs;
  attrs.axes = {axis};
  return Tensor(make_node(OpKind::Iota, DType::i64, shape, {}, attrs, at));
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, std::optional<double> scale,
                                    Loc at) {
  auto shapes = [&] { return shape_string(q.shape()) + ", " + shape_string(k.shape()) + ", " + shape_string(v.shape()); };
  if (q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank())
    throw ShapeError("scaled_dot_product_attention: q, k and v need the same rank >= 2, got " + shapes() + at_line(at));
  const int64_t r = q.rank();
  if (q.shape()[size_t(r - 1)] != k.shape()[size_t(r - 1)] || k.shape()[size_t(r - 2)] != v.shape()[size_t(r - 2)])
    throw ShapeError("scaled_dot_product_attention: q and k need one embedding size and k and v one length, got " + shapes() +
                     at_line(at));
  std::vector<int64_t> perm(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d) perm[size_t(d)] = d;
  std::swap(perm[size_t(r - 1)], perm[size_t(r - 2)]);
  const double s = scale.value_or(1.0 / std::sqrt(double(q.shape()[size_t(r - 1)])));
  Tensor scores = mul(Operand(matmul(q, transpose(k, perm, at), at), at), Operand(s, at));
  if (causal) {
    const std::vector<int64_t> grid = {q.shape()[size_t(r - 2)], k.shape()[size_t(r - 2)]};
    Tensor visible = free_iota(grid, 1, at) <= Operand(free_iota(grid, 0, at), at);
    scores = where(visible, Operand(scores, at), Operand(-std::numeric_limits<double>::infinity(), at), at);
  }
  return matmul(softmax(scores, -1, at), v, at);
}

}  // namespace tessera
