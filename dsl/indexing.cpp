#include "dsl/indexing.hpp"

#include <numeric>

#include "dsl/axes.hpp"
#include "dsl/error.hpp"
#include "dsl/index_check.hpp"
#include "dsl/node.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

// Indexed row loads (take_rows) on global values; local_map's local values take the dense form
// (dsl/indexing.hpp).
bool sparse_rows(const Tensor& x, const Tensor& ids) { return !x.node()->local && !ids.node()->local; }

}  // namespace

namespace detail {

Tensor take_rows(const Tensor& table, const Tensor& ids, Loc at) {
  check_meshes("take_rows", {table.node(), ids.node()}, at);
  std::vector<int64_t> shape = ids.shape();
  shape.push_back(table.shape()[1]);
  return Tensor(make_node(OpKind::TakeRows, table.dtype(), shape, {table.node(), ids.node()}, {}, at));
}

Tensor scatter_add_rows(const Tensor& g, const Tensor& ids, int64_t rows, Loc at) {
  check_meshes("scatter_add_rows", {g.node(), ids.node()}, at);
  NodeAttrs attrs;
  attrs.axes = {rows};
  return Tensor(make_node(OpKind::ScatterAddRows, g.dtype(), {rows, g.shape().back()}, {g.node(), ids.node()}, attrs, at));
}

}  // namespace detail

namespace {

// gather's rows of x along `axis`; an index outside the axis stops the step (dsl/index_check.hpp).
Tensor gather_checked(const Tensor& x, const Tensor& indices, int64_t axis, IndexUse use, Loc at) {
  const int64_t a = checked_axis("gather", axis, x.rank(), at);
  if (indices.dtype() != DType::i32 && indices.dtype() != DType::i64)
    throw DTypeError("gather: indices must be int32 or int64, got " + std::string(dtype_name(indices.dtype())) + at_line(at));
  if (x.dtype() == DType::u8) throw DTypeError("gather: bool tensors are not supported; cast to int32 first" + at_line(at));
  // x with `axis` first, as [extent, rest], whose rows are picked.
  std::vector<int64_t> perm = {a};
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != a) perm.push_back(d);
  const std::vector<int64_t> shape = x.shape();
  int64_t rest = 1;
  std::vector<int64_t> rest_shape;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != a) {
      rest *= shape[size_t(d)];
      rest_shape.push_back(shape[size_t(d)]);
    }
  Tensor rows = reshape(transpose(x, perm, at), {shape[size_t(a)], rest}, at);
  const std::vector<int64_t> index_shape = indices.shape();
  const int64_t n = std::accumulate(index_shape.begin(), index_shape.end(), int64_t(1), std::multiplies<>());
  // Sparse, the indices keep their shape ([..., rest] rows picked): flattened, indices sharded
  // along any axis but the first (an embedding's sequence) would be gathered.
  const bool sparse = sparse_rows(x, indices);
  const Tensor ids = check_index(sparse && indices.rank() > 0 ? indices : reshape(indices, {n}, at), 0, shape[size_t(a)], use, at);
  Tensor picked = sparse ? detail::take_rows(rows, ids, at) : matmul(one_hot(ids, shape[size_t(a)], x.dtype(), at), rows, at);
  // Back to x's axis order, the indices' axes where `axis` was.
  std::vector<int64_t> out_shape = index_shape;
  out_shape.insert(out_shape.end(), rest_shape.begin(), rest_shape.end());
  Tensor out = reshape(picked, out_shape, at);
  const int64_t k = indices.rank();
  std::vector<int64_t> back;
  for (int64_t d = 0; d < a; ++d) back.push_back(k + d);
  for (int64_t d = 0; d < k; ++d) back.push_back(d);
  for (int64_t d = a; d < x.rank() - 1; ++d) back.push_back(k + d);
  return transpose(out, back, at);
}

}  // namespace

Tensor gather(const Tensor& x, const Tensor& indices, int64_t axis, Loc at) {
  return gather_checked(x, indices, axis, IndexUse::GatherIndex, at);
}

Tensor embedding(const Tensor& ids, const Tensor& table, Loc at) {
  if (table.rank() != 2)
    throw ShapeError("embedding: the table must be [num_embeddings, dim], got " + shape_string(table.shape()) + at_line(at));
  return gather_checked(table, ids, 0, IndexUse::EmbeddingId, at);
}

Tensor embedding(const Tensor& ids, const Tensor& table, int64_t padding_idx, Loc at) {
  const int64_t rows = table.rank() == 2 ? table.shape()[0] : 0;
  if (padding_idx < -rows || padding_idx >= rows)
    throw ShapeError("embedding: padding_idx " + std::to_string(padding_idx) + " is outside the table's " + std::to_string(rows) +
                     " rows" + at_line(at));
  const int64_t pad = padding_idx < 0 ? padding_idx + rows : padding_idx;
  // The padding row read through a zero-gradient path: its value, with nothing flowing back.
  const Tensor picked = embedding(ids, table, at);
  const Tensor is_pad = expand_dims(ids == Operand(pad, at), -1, at);
  return where(is_pad, Operand(stop_gradient(picked, at), at), Operand(picked, at), at);
}

Tensor index_select(const Tensor& x, int64_t axis, const Tensor& indices, Loc at) {
  if (indices.rank() != 1)
    throw ShapeError("index_select: indices must be 1-D, got " + shape_string(indices.shape()) + at_line(at));
  return gather_checked(x, indices, checked_axis("index_select", axis, x.rank(), at), IndexUse::IndexSelectIndex, at);
}

namespace {

// x and indices with `axis` last (the caller's other axes must agree), for the along-axis ops.
void check_along_axis(std::string_view op, const Tensor& x, const Tensor& indices, int64_t axis, Loc at) {
  if (indices.dtype() != DType::i32 && indices.dtype() != DType::i64)
    throw DTypeError(std::string(op) + ": indices must be int32 or int64, got " + std::string(dtype_name(indices.dtype())) + at_line(at));
  if (indices.rank() != x.rank())
    throw ShapeError(std::string(op) + ": indices " + shape_string(indices.shape()) + " need x's rank " + std::to_string(x.rank()) + at_line(at));
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != axis && indices.shape()[size_t(d)] != x.shape()[size_t(d)])
      throw ShapeError(std::string(op) + ": indices " + shape_string(indices.shape()) + " and x " + shape_string(x.shape()) +
                       " differ on axis " + std::to_string(d) + " (only axis " + std::to_string(axis) + " may)" + at_line(at));
}

// [.., k, n]: whether indices[.., j] (j along k) equals each position e of an axis of extent n.
Tensor matches(const Tensor& indices_last, int64_t n, Loc at) {
  const int64_t r = indices_last.rank() + 1;
  std::vector<int64_t> shape(size_t(r), 1);
  shape.back() = n;
  NodeAttrs attrs;
  attrs.axes = {r - 1};
  const Tensor e(make_node(OpKind::Iota, DType::i64, shape, {}, attrs, at));
  return expand_dims(cast(indices_last, DType::i64, at), -1, at) == Operand(e, at);
}

}  // namespace

Tensor take_along_axis(const Tensor& x, const Tensor& indices, int64_t axis, Loc at) {
  const int64_t a = checked_axis("take_along_axis", axis, x.rank(), at);
  check_along_axis("take_along_axis", x, indices, a, at);
  const int64_t n = x.shape()[size_t(a)], r = x.rank();
  const std::vector<int64_t> perm = axis_last(r, a);
  const Tensor ids = check_index(transpose(indices, perm, at), 0, n, IndexUse::TakeAlongAxisIndex, at);
  // out[.., j] = the sum over e of x[.., e] where ids[.., j] == e: one term each.
  const Tensor zero(make_node(OpKind::Full, x.dtype(), {}, {}, {}, at));
  const Tensor picked = where(matches(ids, n, at), expand_dims(transpose(x, perm, at), -2, at), zero, at);
  const Tensor one_term = cast(reduce_sum(picked, {r}, false, at), x.dtype(), at);  // x's dtype: one term, no overflow
  return transpose(one_term, inverse_permutation(perm), at);
}

Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& indices, const Tensor& src, Loc at) {
  const int64_t a = checked_axis("scatter_add", axis, x.rank(), at);
  check_along_axis("scatter_add", x, indices, a, at);
  if (src.shape() != indices.shape())
    throw ShapeError("scatter_add: src " + shape_string(src.shape()) + " and indices " + shape_string(indices.shape()) +
                     " must have one shape" + at_line(at));
  if (src.dtype() != x.dtype())
    throw DTypeError("scatter_add: src is " + std::string(dtype_name(src.dtype())) + " but x is " + std::string(dtype_name(x.dtype())) + at_line(at));
  const int64_t n = x.shape()[size_t(a)], r = x.rank();
  const std::vector<int64_t> perm = axis_last(r, a);
  const Tensor ids = check_index(transpose(indices, perm, at), 0, n, IndexUse::ScatterIndex, at);
  // added[.., e] = the sum over j of src[.., j] where ids[.., j] == e.
  const Tensor zero(make_node(OpKind::Full, x.dtype(), {}, {}, {}, at));
  const Tensor spread = where(matches(ids, n, at), expand_dims(transpose(src, perm, at), -1, at), zero, at);
  const Tensor added = cast(reduce_sum(spread, {r - 1}, false, at), x.dtype(), at);  // PyTorch adds in x's dtype
  return x + transpose(added, inverse_permutation(perm), at);
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value, Loc at) {
  if (mask.dtype() != DType::u8)
    throw DTypeError("masked_fill: the mask must be bool, got " + std::string(dtype_name(mask.dtype())) + at_line(at));
  return where(mask, Operand(value, at), Operand(x, at), at);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis, Loc at) {
  const int64_t a = checked_axis("split", axis, x.rank(), at);
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) throw ShapeError("split: a piece has negative extent " + std::to_string(s) + at_line(at));
    total += s;
  }
  if (total != x.shape()[size_t(a)])
    throw ShapeError("split: the pieces add up to " + std::to_string(total) + " but axis " + std::to_string(a) + " of " +
                     shape_string(x.shape()) + " has extent " + std::to_string(x.shape()[size_t(a)]) + at_line(at));
  std::vector<Tensor> out;
  std::vector<int64_t> begin(size_t(x.rank()), 0);
  for (int64_t s : sizes) {
    std::vector<int64_t> size = x.shape();
    size[size_t(a)] = s;
    out.push_back(slice(x, begin, size, at));
    begin[size_t(a)] += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis, Loc at) {
  const int64_t a = checked_axis("chunk", axis, x.rank(), at);
  if (chunks < 1) throw ShapeError("chunk: chunks must be at least 1, got " + std::to_string(chunks) + at_line(at));
  const int64_t extent = x.shape()[size_t(a)], piece = (extent + chunks - 1) / chunks;
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < extent; start += piece) sizes.push_back(std::min(piece, extent - start));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, a, at);
}

}  // namespace tessera
