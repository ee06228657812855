#include "nn/clip_grad_norm.hpp"

#include "dsl/error.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

Tensor clip_grad_norm(std::vector<Tensor>& grads, double max_norm, Loc at) {
  if (!(max_norm > 0)) throw Error("clip_grad_norm: max_norm must be positive, got " + std::to_string(max_norm) + at_line(at));
  if (grads.empty()) throw ShapeError("clip_grad_norm: no gradients" + at_line(at));
  std::optional<Tensor> total;  // in float64 whatever the gradients' dtypes, as one scalar
  for (const Tensor& g : grads) {
    Tensor squares = reduce_sum(square(cast(g, DType::f64, at), at), {}, false, at);
    total = total ? add(Operand(*total, at), Operand(squares, at)) : squares;
  }
  Tensor norm = sqrt(*total, at);
  Tensor scale = minimum(Operand(1.0, at), Operand(div(Operand(max_norm, at), Operand(add(Operand(norm, at), Operand(1e-6, at)), at)), at));
  for (Tensor& g : grads) g = mul(Operand(g, at), Operand(cast(scale, g.dtype(), at), at));
  return norm;
}

}  // namespace tessera
