#include "dsl/activations.hpp"

#include <cmath>


namespace tessera {

Tensor erf(const Tensor& x, Loc at) {
  auto o = [&](const Tensor& t) { return Operand(t, at); };
  auto c = [&](double v) { return Operand(v, at); };
  // erfc(|x|) = t exp(-x^2 + P(t)), t = 1 / (1 + |x| / 2); erf = sign(x) (1 - erfc(|x|)).
  Tensor z = abs(x, at);
  Tensor t = div(c(1.0), o(add(c(1.0), o(mul(o(z), c(0.5))))));
  const double coefficients[] = {-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                                 0.27886807,  -1.13520398, 1.48851587, -0.82215223, 0.17087277};
  Tensor p = mul(o(t), c(coefficients[9]));
  for (int i = 8; i >= 1; --i) p = mul(o(t), o(add(o(p), c(coefficients[i]))));
  p = add(o(p), c(coefficients[0]));
  Tensor erfc = mul(o(t), o(exp(sub(o(p), o(square(z, at))), at)));
  Tensor magnitude = sub(c(1.0), o(erfc));
  return where(o(x) < c(0.0), neg(magnitude, at), magnitude, at);
}

Tensor gelu(const Tensor& x, bool approximate, Loc at) {
  auto o = [&](const Tensor& t) { return Operand(t, at); };
  auto c = [&](double v) { return Operand(v, at); };
  if (approximate) {
    Tensor cube = mul(o(square(x, at)), o(x));
    Tensor inner = mul(o(add(o(x), o(mul(o(cube), c(0.044715))))), c(std::sqrt(2.0 / M_PI)));
    return mul(o(mul(o(x), c(0.5))), o(add(c(1.0), o(tanh(inner, at)))));
  }
  Tensor phi = mul(o(add(c(1.0), o(erf(mul(o(x), c(M_SQRT1_2)), at)))), c(0.5));
  return mul(o(x), o(phi));
}

Tensor silu(const Tensor& x, Loc at) { return mul(Operand(x, at), Operand(sigmoid(x, at), at)); }

}  // namespace tessera
