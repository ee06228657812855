#include "dsl/normalization.hpp"

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
  check_affine("layer_norm", x, weight, "weight", at);
  check_affine("layer_norm", x, bias, "bias", at);
  const int64_t last = x.rank() - 1;
  Tensor centred = sub(Operand(x, at), Operand(reduce_mean(x, {last}, true, at), at));
  Tensor variance = reduce_mean(square(centred, at), {last}, true, at);
  Tensor normalised = mul(Operand(centred, at), Operand(rsqrt(add(Operand(variance, at), Operand(eps, at)), at), at));
  return affine(normalised, weight, bias, at);
}

Tensor rms_norm(const Tensor& x, const std::optional<Tensor>& weight, double eps, Loc at) {
  check_affine("rms_norm", x, weight, "weight", at);
  const int64_t last = x.rank() - 1;
  Tensor mean_square = reduce_mean(square(x, at), {last}, true, at);
  return affine(mul(Operand(x, at), Operand(rsqrt(add(Operand(mean_square, at), Operand(eps, at)), at), at)), weight, std::nullopt, at);
}

}  // namespace tessera
