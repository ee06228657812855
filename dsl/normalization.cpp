#include "dsl/normalization.hpp"

#include <algorithm>
#include <utility>

#include "dsl/element_count.hpp"
#include "dsl/error.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

void check_affine(std::string_view op, const Tensor& x, const std::optional<Tensor>& p, std::string_view what, Loc at) {
  if (x.rank() < 1) throw ShapeError(std::string(op) + ": the input is a scalar; it normalises over its last axis" + at_line(at));
  if (p && p->shape() != std::vector<int64_t>{x.shape().back()})
    throw ShapeError(std::string(op) + ": " + std::string(what) + " has shape " + shape_string(p->shape()) + " but the last axis of " +
                     shape_string(x.shape()) + " has extent " + std::to_string(x.shape().back()) + at_line(at));
}

Tensor affine(Tensor y, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, Loc at) {
  if (weight) y = mul(Operand(y, at), Operand(*weight, at));
  if (bias) y = add(Operand(y, at), Operand(*bias, at));
  return y;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, double eps, Loc at) {
  std::vector<int64_t> normalized = weight ? weight->shape() : bias ? bias->shape() : std::vector<int64_t>{};
  if (normalized.empty() && x.rank() > 0) normalized = {x.shape().back()};
  return layer_norm(x, normalized, weight, bias, eps, at);
}

Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, double eps, Loc at) {
  const int64_t k = int64_t(normalized_shape.size());
  if (k < 1 || k > x.rank() ||
      !std::equal(normalized_shape.begin(), normalized_shape.end(), x.shape().end() - k))
    throw ShapeError("layer_norm: normalized_shape " + shape_string(normalized_shape) + " is not the trailing extents of " +
                     shape_string(x.shape()) + at_line(at));
  for (const auto& [p, what] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}})
    if (*p && (*p)->shape() != normalized_shape)
      throw ShapeError("layer_norm: " + std::string(what) + " has shape " + shape_string((*p)->shape()) + " but normalized_shape is " +
                       shape_string(normalized_shape) + at_line(at));
  std::vector<int64_t> axes;
  for (int64_t a = x.rank() - k; a < x.rank(); ++a) axes.push_back(a);
  if (x.dtype() == DType::f64) {  // two passes: the mean first, then the squares about it
    Tensor centred = sub(Operand(x, at), Operand(reduce_mean(x, axes, true, at), at));
    Tensor variance = reduce_mean(square(centred, at), axes, true, at);
    Tensor normalised = mul(Operand(centred, at), Operand(rsqrt(add(Operand(variance, at), Operand(eps, at)), at), at));
    return affine(normalised, weight, bias, at);
  }
  // One pass: the sum and the sum of squares, stacked, are reduced together, so over a sharded
  // axis both travel in one all_reduce (the two passes above need two, one after the other).
  // E[x^2] - E[x]^2 cancels when the mean is large against the spread; accumulated in f64
  // from f32 (or narrower) inputs, its error stays below f32's rounding of the result while
  // |mean| / std < ~1e4, beyond which the inputs' own f32 rounding already dominates.
  const int64_t count = element_count(normalized_shape);
  const int64_t last = x.rank() - 1;
  const Tensor wide = cast(x, DType::f64, at);
  const Tensor sums = concat({reduce_sum(wide, axes, true, at), reduce_sum(square(wide, at), axes, true, at)}, last, at);
  const Tensor moments = div(Operand(detail::reduce_partials(sums, at), at), Operand(double(count), at));
  std::vector<int64_t> begin(size_t(x.rank()), 0), size = moments.shape();
  size.back() = 1;
  const Tensor mean = slice(moments, begin, size, at);
  begin.back() = 1;
  const Tensor mean_square = slice(moments, begin, size, at);
  const Tensor variance = maximum(Operand(sub(Operand(mean_square, at), Operand(square(mean, at), at)), at), Operand(0.0, at));
  const Tensor inverse_std = cast(rsqrt(add(Operand(variance, at), Operand(eps, at)), at), x.dtype(), at);
  Tensor normalised = mul(Operand(sub(Operand(x, at), Operand(cast(mean, x.dtype(), at), at)), at), Operand(inverse_std, at));
  return affine(normalised, weight, bias, at);
}

Tensor rms_norm(const Tensor& x, const std::optional<Tensor>& weight, double eps, Loc at) {
  check_affine("rms_norm", x, weight, "weight", at);
  const int64_t last = x.rank() - 1;
  Tensor mean_square = reduce_mean(square(x, at), {last}, true, at);
  return affine(mul(Operand(x, at), Operand(rsqrt(add(Operand(mean_square, at), Operand(eps, at)), at), at)), weight, std::nullopt, at);
}

}  // namespace tessera
