// Picking and splitting: gather / embedding, masked_fill, split / chunk. A gather is the
// primitive take_rows (an indexed load) and its gradient scatter_add_rows (each row added where
// its id points, in order, so deterministic): a table sharded along the gathered axis is used
// where it lies, each device picking the ids it holds and zeros for the rest, and the partial
// sums are all_reduced (PyTorch's vocabulary-parallel embedding), on CPU and GPU meshes alike
// (CUDA lowers both in parallel, in the CPU's order: codegen/lower_kernel.hpp). local_map values
// take a one-hot product instead (its gradient the dense one_hot^T x g).
#pragma once

#include <vector>

#include "dsl/ops.hpp"

namespace tessera {

// numpy's take: x's entries at `indices` (int32/int64, any shape) along `axis`; the result has
// x's shape with that axis replaced by the indices' shape. An index outside [0, extent) stops
// the step with an IndexError (dsl/index_check.hpp); embedding's ids alike.
Tensor gather(const Tensor& x, const Tensor& indices, int64_t axis, Loc where = Loc::current());
// table[ids]: rows of a [num_embeddings, dim] table, shaped ids.shape() + [dim]. With
// padding_idx (PyTorch's), rows picked by that id get no gradient (the table's row stays put).
Tensor embedding(const Tensor& ids, const Tensor& table, Loc where = Loc::current());
Tensor embedding(const Tensor& ids, const Tensor& table, int64_t padding_idx, Loc where = Loc::current());
// torch.index_select: gather with 1-D indices.
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& indices, Loc where = Loc::current());
// torch.gather / numpy's take_along_axis: out[.., j, ..] = x[.., indices[.., j, ..], ..] along
// `axis`; indices has x's rank and x's extents on the other axes.
Tensor take_along_axis(const Tensor& x, const Tensor& indices, int64_t axis, Loc where = Loc::current());
// torch.scatter_add: x with src[.., j, ..] added at x[.., indices[.., j, ..], ..] along `axis`
// (repeated indices add up); indices and src have one shape, x's on the other axes.
Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& indices, const Tensor& src, Loc where = Loc::current());
namespace detail {
// The primitives (dsl/op_kind.hpp): table [V, D] rows at ids [...] -> [..., D], and g [..., D] added
// into `rows` zero rows at ids -> [rows, D]. Ids outside [0, V) pick zeros and add nothing.
Tensor take_rows(const Tensor& table, const Tensor& ids, Loc where);
Tensor scatter_add_rows(const Tensor& g, const Tensor& ids, int64_t rows, Loc where);
}  // namespace detail

// x where mask (bool, broadcastable to x) is false, `value` where it is true.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value, Loc where = Loc::current());
// Consecutive pieces of `axis` with the given extents (they must add up to the axis's).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis = 0, Loc where = Loc::current());
// torch.chunk: pieces of ceil(extent / chunks) along `axis`, the last smaller (so possibly fewer).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis = 0, Loc where = Loc::current());

}  // namespace tessera
