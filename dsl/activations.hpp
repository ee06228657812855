// Activations of transformer blocks, built from the primitive ops (so every layout, sharding
// rule and gradient comes with them).
#pragma once

#include "dsl/ops.hpp"

namespace tessera {

// The error function, to about 1.2e-7 relative (Numerical Recipes' erfc Chebyshev fit): enough
// for float32, and differentiable like any composite.
Tensor erf(const Tensor& x, Loc where = Loc::current());
// PyTorch's gelu: x * Phi(x) with the erf above, or with `approximate` (PyTorch's "tanh")
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's.
Tensor gelu(const Tensor& x, bool approximate = false, Loc where = Loc::current());
// x * sigmoid(x) (SwiGLU's gate).
Tensor silu(const Tensor& x, Loc where = Loc::current());

}  // namespace tessera
