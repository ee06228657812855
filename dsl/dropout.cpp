#include "dsl/dropout.hpp"

#include "dsl/error.hpp"
#include "dsl/node.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

Tensor dropout(const Tensor& x, double rate, uint64_t seed, Loc at) {
  if (!(rate >= 0.0 && rate < 1.0))
    throw Error("dropout: rate must lie in [0, 1), got " + std::to_string(rate) + at_line(at));
  if (!is_floating(x.dtype())) throw DTypeError("dropout: x must be floating, got " + std::string(dtype_name(x.dtype())) + at_line(at));
  if (rate == 0.0) return x;
  // Uniform numbers with no layout of their own: generated in whatever layout x is used in,
  // each from its global index, so the mask is the same on every mesh.
  NodeAttrs attrs;
  attrs.seed = seed;
  attrs.scalar = 0.0;
  attrs.scalar2 = 1.0;
  Tensor uniform(make_node(OpKind::RandomUniform, DType::f32, x.shape(), {}, attrs, at));
  Tensor keep = Operand(uniform, at) >= Operand(rate, at);
  return where(keep, Operand(mul(Operand(x, at), Operand(1.0 / (1.0 - rate), at)), at), Operand(0.0, at), at);
}

}  // namespace tessera
