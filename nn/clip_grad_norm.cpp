#include "nn/clip_grad_norm.hpp"

#include "dsl/error.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

Tensor clip_grad_norm(std::vector<Tensor>& grads, double max_norm, Loc at) {
  if (!(max_norm > 0)) throw Error("clip_grad_norm: max_norm must be positive, got " + std::to_string(max_norm) + at_line(at));
  std::vector<Tensor> squares;  // in float64 whatever the gradients' dtypes
  for (const Tensor& g : grads) squares.push_back(reduce_sum(square(cast(g, DType::f64, at), at), {}, false, at));
  return clip_grad_norm(grads, squares, max_norm, at);
}

Tensor clip_grad_norm(std::vector<Tensor>& grads, const std::vector<Tensor>& squares, double max_norm, Loc at) {
  if (!(max_norm > 0)) throw Error("clip_grad_norm: max_norm must be positive, got " + std::to_string(max_norm) + at_line(at));
  if (grads.empty() || squares.empty()) throw ShapeError("clip_grad_norm: no gradients" + at_line(at));
  std::optional<Tensor> total;
  for (const Tensor& s : squares) total = total ? add(Operand(*total, at), Operand(s, at)) : s;
  Tensor norm = sqrt(*total, at);
  Tensor scale = minimum(Operand(1.0, at), Operand(div(Operand(max_norm, at), Operand(add(Operand(norm, at), Operand(1e-6, at)), at)), at));
  for (Tensor& g : grads) g = mul(Operand(g, at), Operand(cast(scale, g.dtype(), at), at));
  return norm;
}

}  // namespace tessera
