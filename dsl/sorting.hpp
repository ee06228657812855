// Ordering along an axis: sort / argsort / topk, cumsum, and multinomial sampling (which needs
// the running sum). Each is a composite of the primitive ops, so sharding rules, gradients and
// the reference evaluator come from theirs: an element's rank is the number of elements that
// come before it (a [.., n, n] comparison), and a sorted position picks the element of that rank.
// The comparison is quadratic in the axis's extent: meant for rows of a vocabulary or a
// sequence, not for sorting millions of elements. topk of a long row ranks blocks of it, then
// the blocks' candidates (n * b + (n / b * k)^2 comparisons), and over a sharded axis moves
// only the candidates (when its shards hold whole blocks). A sharded row that sort or topk ranks
// whole, and multinomial's categories, are gathered once first (dsl/whole_axis.hpp).
#pragma once

#include <cstdint>
#include <utility>

#include "dsl/ops.hpp"

namespace tessera {

// Values sorted along `axis` and their int64 positions in x. Stable (equal values keep their
// order); NaN sorts as the largest value, as in PyTorch.
std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t axis = -1, bool descending = false, Loc where = Loc::current());
Tensor argsort(const Tensor& x, int64_t axis = -1, bool descending = false, Loc where = Loc::current());
// The k largest values along `axis`, largest first, and their int64 positions.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t axis = -1, Loc where = Loc::current());
// Running sum along `axis` (element i: the sum of elements 0..i).
Tensor cumsum(const Tensor& x, int64_t axis, Loc where = Loc::current());
// n int64 draws per row of `probs` [.., V] (non-negative weights, not necessarily normalised),
// with replacement: [.., n]. Counter-based like random_uniform, so the same on every layout.
Tensor multinomial(const Tensor& probs, int64_t n, uint64_t seed, Loc where = Loc::current());

}  // namespace tessera
