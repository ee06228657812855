// Picking and splitting: gather / embedding, masked_fill, split / chunk. Built from primitive
// ops: a gather is a one-hot product, so a table sharded along the gathered axis is used where
// it lies (each device's one-hot columns meet its own rows, and the partial sums are all_reduced,
// PyTorch's vocabulary-parallel embedding), and its gradient is the scatter-add one_hot^T x g.
#pragma once

#include <vector>

#include "dsl/ops.hpp"

namespace tessera {

// numpy's take: x's entries at `indices` (int32/int64, any shape) along `axis`; the result has
// x's shape with that axis replaced by the indices' shape. An index outside [0, extent) gives
// zeros (as a vocabulary shard does for ids it does not hold).
Tensor gather(const Tensor& x, const Tensor& indices, int64_t axis, Loc where = Loc::current());
// table[ids]: rows of a [num_embeddings, dim] table, shaped ids.shape() + [dim].
Tensor embedding(const Tensor& ids, const Tensor& table, Loc where = Loc::current());
// x where mask (bool, broadcastable to x) is false, `value` where it is true.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value, Loc where = Loc::current());
// Consecutive pieces of `axis` with the given extents (they must add up to the axis's).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis = 0, Loc where = Loc::current());
// torch.chunk: pieces of ceil(extent / chunks) along `axis`, the last smaller (so possibly fewer).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis = 0, Loc where = Loc::current());

}  // namespace tessera
