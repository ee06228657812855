#include "dsl/sorting.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "dsl/axes.hpp"
#include "dsl/error.hpp"
#include "dsl/index_check.hpp"
#include "dsl/indexing.hpp"
#include "dsl/node.hpp"
#include "dsl/string_util.hpp"
#include "dsl/whole_axis.hpp"

namespace tessera {
namespace {

// topk ranks rows up to this long whole; longer ones in blocks of at least kTopkSmallestBlock.
constexpr int64_t kTopkWholeRow = 512;
constexpr int64_t kTopkSmallestBlock = 64;

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

// x with `items` trailing axes (its last `items` axes index the elements being ranked) viewed
// as [.., items, 1..1] (`first`) or [.., 1..1, items] (not `first`), for pairwise comparisons.
Tensor item_side(const Tensor& x, int64_t items, bool first, Loc at) {
  const std::vector<int64_t> full = x.shape();
  std::vector<int64_t> shape(full.begin(), full.end() - items);
  if (!first) shape.insert(shape.end(), size_t(items), 1);
  shape.insert(shape.end(), full.end() - items, full.end());
  if (first) shape.insert(shape.end(), size_t(items), 1);
  return reshape(x, shape, at);
}

// rank[.., i]: how many elements come before element i in sorted order, over the elements the
// last `items` axes index; ties go by `order` (same shape as x, distinct per element: the
// smaller first), or by position along the last axis when there is no `order`.
Tensor ranks(const Tensor& x, bool descending, Loc at, int64_t items = 1, const std::optional<Tensor>& order = std::nullopt) {
  const int64_t r = x.rank() + items;
  const Tensor xi = item_side(x, items, true, at), xj = item_side(x, items, false, at);
  // NaN is the largest value: ascending it comes last, descending first.
  const Tensor nan_i = is_nan(xi, at), nan_j = is_nan(xj, at);
  // The i side is the first operand throughout: over a sharded axis the [.., i, j] comparisons
  // then stay sharded like i, and the partitioner gathers the j side (the elements), never the
  // comparisons.
  const Tensor j_first = descending ? either(xi < xj, both(nan_i == 0, nan_j, at) > 0, at)
                                    : either(xi > xj, both(nan_i, nan_j == 0, at) > 0, at);
  const Tensor same = either(xi == xj, both(nan_i, nan_j, at) > 0, at);
  const int64_t n = x.shape().back();
  const Tensor j_earlier = order ? item_side(*order, items, true, at) > item_side(*order, items, false, at)
                                 : positions(n, r, at, -2) > positions(n, r, at);
  const Tensor j_before_i = either(j_first > 0, both(same > 0, j_earlier, at) > 0, at);
  std::vector<int64_t> item_axes;
  for (int64_t a = r - items; a < r; ++a) item_axes.push_back(a);
  return reduce_sum(j_before_i, item_axes, false, at);
}

// out[.., p] = value[.., i] of the element i whose rank is p, for the first `count` positions p
// (the elements indexed by the last `items` axes of rank and value).
Tensor place_by_rank(const Tensor& rank, const Tensor& value, int64_t count, Loc at, int64_t items = 1) {
  const int64_t r = rank.rank() + 1;
  const Tensor hit = expand_dims(rank, -1, at) == positions(count, r, at);  // [.., i, p]
  const Tensor zero(make_node(OpKind::Full, value.dtype(), {}, {}, {}, at));
  std::vector<int64_t> item_axes;
  for (int64_t a = r - 1 - items; a < r - 1; ++a) item_axes.push_back(a);
  // One term per position: the sum cannot overflow value's dtype, which it keeps.
  return cast(reduce_sum(where(hit, expand_dims(value, -1, at), zero, at), item_axes, false, at), value.dtype(), at);
}

// The block length for a row of n: near the one minimising n * b + (n / b * k)^2, never below k
// (a block gives k candidates). A divisor of n is preferred, first one whose block count the
// row's `shards` divide, then the one leaving the most factors of 2 (up to 2^6) in it: no
// padding (a pad of a sharded axis gathers it), and the blocks then fall on the shard
// boundaries of a row split evenly over `shards` (or 2, 4, 8, ..) devices, so each device ranks
// its own blocks.
int64_t topk_block(int64_t n, int64_t k, int64_t shards) {
  const int64_t ideal = std::max({k, kTopkSmallestBlock, int64_t(std::cbrt(2.0 * double(n) * double(k) * double(k)))});
  int64_t best = ideal, best_twos = -1;
  bool best_fits = false;
  for (int64_t b = std::max(k, ideal / 4); b <= 4 * ideal && b <= n / 2; ++b) {
    if (n % b) continue;
    const bool fits = shards > 1 && (n / b) % shards == 0;
    const int64_t twos = std::min(std::countr_zero(uint64_t(n / b)), 6);  // 64 devices are plenty
    const bool closer = std::abs(std::log(double(b) / double(ideal))) < std::abs(std::log(double(best) / double(ideal)));
    if (std::tuple(fits, twos) > std::tuple(best_fits, best_twos) || (std::tuple(fits, twos) == std::tuple(best_fits, best_twos) && closer)) {
      best = b;
      best_twos = twos;
      best_fits = fits;
    }
  }
  return best;
}

// Whether top_of_last ranks a row of n whole (else in blocks, then the blocks' candidates).
bool ranked_whole(int64_t n, int64_t k, int64_t shards) { return n <= kTopkWholeRow || 2 * topk_block(n, k, shards) > n; }

// How many blocks x's `axis` is split into now (sharding propagation, no kernel): 1 for
// local_map's local values.
int64_t shards_of(const Tensor& x, int64_t axis) {
  if (x.node()->local || !x.node()->mesh.is_valid()) return 1;
  return x.layout().num_shards(axis);
}

// The k largest along the last axis, largest first, ties in position order (NaN largest).
// A long row is cut into blocks: each block's top k (a [.., b, b] comparison per block), then
// the top k of those B * k candidates, so the work is n * b + (B * k)^2 instead of n^2, and
// over a sharded axis each device ranks its own blocks and only the candidates move.
// `shards`: how many blocks the row is split into over the mesh.
std::pair<Tensor, Tensor> top_of_last(const Tensor& x, int64_t k, int64_t shards, Loc at) {
  const int64_t n = x.shape().back(), r = x.rank();
  if (k == 0) {  // nothing to rank
    std::vector<int64_t> none = x.shape();
    none.back() = 0;
    const Tensor empty = slice(x, std::vector<int64_t>(size_t(r), 0), none, at);
    return {empty, cast(empty, DType::i64, at)};
  }
  if (ranked_whole(n, k, shards)) {
    const Tensor rank = ranks(x, true, at);
    const Tensor index = broadcast_to(positions(n, r, at), x.shape(), at);
    return {place_by_rank(rank, x, k, at), place_by_rank(rank, index, k, at)};
  }
  const int64_t block = topk_block(n, k, shards), blocks = (n + block - 1) / block;
  // The padding ranks below every element, ties included (it comes after them): never chosen.
  const double lowest = is_floating(x.dtype()) ? -std::numeric_limits<double>::infinity()
                        : x.dtype() == DType::i32 ? double(std::numeric_limits<int32_t>::min())
                                                   : double(std::numeric_limits<int64_t>::min());
  std::vector<std::pair<int64_t, int64_t>> padding(size_t(r), {0, 0});
  padding.back().second = blocks * block - n;
  std::vector<int64_t> blocked = x.shape();
  blocked.back() = blocks;
  blocked.push_back(block);
  const Tensor rows = padding.back().second ? pad(x, padding, lowest, at) : x;
  auto [block_values, block_positions] = top_of_last(reshape(rows, blocked, at), k, 1, at);  // [.., B, k]
  const Tensor positions_in_row = block_positions + positions(blocks, r + 1, at, -2) * block;
  // The B * k candidates ranked where they are ([.., B, k]; a sharded B stays sharded and only
  // the candidates' values are gathered). Ties go by candidate order, block-major, which among
  // equal values is their order in the row (and puts the padding last).
  const Tensor candidate_order = positions(blocks, r + 1, at, -2) * k + positions(k, r + 1, at);
  const Tensor rank = ranks(block_values, true, at, 2, candidate_order);
  // Replicated results, as a sort's are: the selection's sum over the blocks is reduced here.
  return {detail::reduce_partials(place_by_rank(rank, block_values, k, at, 2), at),
          detail::reduce_partials(place_by_rank(rank, positions_in_row, k, at, 2), at)};
}

}  // namespace

std::pair<Tensor, Tensor> sort(const Tensor& x, int64_t axis, bool descending, Loc at) {
  const int64_t a = checked_axis("sort", axis, x.rank(), at);
  if (x.dtype() == DType::u8) throw DTypeError("sort: bool tensors are not supported; cast them first" + at_line(at));
  // Each device ranks the whole row (one gather where it is sharded), so the result is whole too.
  const Tensor last = to_last(detail::whole_along(x, a, at), a, at);
  const Tensor rank = ranks(last, descending, at);
  const Tensor index = broadcast_to(positions(last.shape().back(), last.rank(), at), last.shape(), at);
  const int64_t n = last.shape().back();
  return {from_last(place_by_rank(rank, last, n, at), a, at), from_last(place_by_rank(rank, index, n, at), a, at)};
}

Tensor argsort(const Tensor& x, int64_t axis, bool descending, Loc at) { return sort(x, axis, descending, at).second; }

std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t axis, Loc at) {
  const int64_t a = checked_axis("topk", axis, x.rank(), at);
  const int64_t n = x.shape()[size_t(a)];
  if (k < 0 || k > n)
    throw ShapeError("topk: k = " + std::to_string(k) + " is outside [0, " + std::to_string(n) + "] for axis " +
                     std::to_string(axis) + " of " + shape_string(x.shape()) + at_line(at));
  if (x.dtype() == DType::u8) throw DTypeError("topk: bool tensors are not supported; cast them first" + at_line(at));
  // A short row is ranked whole on every device: one gather, and whole results (ranked on its
  // blocks, each device's picks would be a Partial sum). A long one moves only its candidates.
  const int64_t shards = n > kTopkWholeRow ? shards_of(x, a) : 1;
  const Tensor row = k > 0 && ranked_whole(n, k, shards) ? detail::whole_along(x, a, at) : x;
  auto [values, indices] = top_of_last(to_last(row, a, at), k, shards, at);
  return {from_last(values, a, at), from_last(indices, a, at)};
}

Tensor cumsum(const Tensor& x, int64_t axis, Loc at) {
  const int64_t a = checked_axis("cumsum", axis, x.rank(), at);
  const Tensor last = to_last(cast(x, sum_dtype(x.dtype()), at), a, at);
  const int64_t n = last.shape().back(), r = last.rank() + 1;
  // Element i adds elements j <= i: a [.., i, j] mask over the row.
  const Tensor j_le_i = positions(n, r, at) <= positions(n, r, at, -2);
  const Tensor zero = Tensor(make_node(OpKind::Full, last.dtype(), {}, {}, {}, at));
  return from_last(reduce_sum(where(j_le_i, expand_dims(last, -2, at), zero, at), {r - 1}, false, at), a, at);
}

Tensor multinomial(const Tensor& probs, int64_t n, uint64_t seed, Loc at) {
  if (!is_floating(probs.dtype())) throw DTypeError("multinomial: probs must be floating, got " + std::string(dtype_name(probs.dtype())) + at_line(at));
  if (probs.rank() < 1 || probs.shape().back() == 0) throw ShapeError("multinomial: probs needs a non-empty last axis, got " + shape_string(probs.shape()) + at_line(at));
  if (n < 0) throw ShapeError("multinomial: n = " + std::to_string(n) + " is negative" + at_line(at));
  const Mesh mesh = probs.node()->mesh;
  if (!mesh.is_valid()) throw LayoutError("multinomial: probs has no mesh" + at_line(at));
  const int64_t v = probs.shape().back(), r = probs.rank();
  // Whole rows on every device: a running sum split over devices would round differently on
  // each layout, and so would draws falling near a category's edge.
  const Tensor weights = detail::whole_along(probs, r - 1, at);
  const Tensor cdf = cumsum(weights, -1, at);
  std::vector<int64_t> begin(size_t(r), 0), size = probs.shape();
  begin.back() = v - 1;
  size.back() = 1;
  const Tensor total = slice(cdf, begin, size, at);  // [.., 1]
  std::vector<int64_t> draws_shape = probs.shape();
  draws_shape.back() = n;
  // Draw d picks the first category whose running sum exceeds u * total: the count of those not exceeding it.
  const Tensor u = random_uniform(draws_shape, seed, Layout::replicated(mesh, r), 0, 1, probs.dtype(), at) * total;
  const Tensor below = cast(expand_dims(cdf, -2, at) <= expand_dims(u, -1, at), DType::i64, at);  // [.., n, V]
  const Tensor draws = minimum(reduce_sum(below, {r}, false, at), int64_t(v - 1));
  // Weights that are no distribution (PyTorch raises "invalid multinomial distribution") would
  // still give plausible indices: each row's fault is a code the step checks when it runs
  // (dsl/index_check.hpp), 0 for a valid row. The checked codes are added to the draws (zeros),
  // so the check runs wherever the draws are used.
  auto fault = [&](const Tensor& bad, int64_t code) { return reduce_max(cast(bad, DType::i64, at), {r - 1}, true, at) * code; };
  const Tensor code = maximum(maximum(fault(weights < 0.0, int64_t(MultinomialFault::Negative)), fault(weights != weights, int64_t(MultinomialFault::NaN))),
                              maximum(fault(abs(weights, at) == INFINITY, int64_t(MultinomialFault::Infinite)),
                                      cast(total == 0.0, DType::i64, at) * int64_t(MultinomialFault::SumsToZero)));
  return draws + check_index(code, 0, 1, IndexUse::MultinomialWeights, at);
}

}  // namespace tessera
