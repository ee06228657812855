// Single-precision exp, log, cos, sin and tanh written in kernel IR (Cephes-style range reduction
// plus minimax polynomials, ~1-2 ulp). They vectorise like any other arithmetic, and every
// element takes the same path whether it lands in the vector body or the scalar remainder of a
// loop, so results never depend on the layout (libm/libmvec would differ between the two).
// Double precision uses the libm intrinsics (scalar, so equally consistent).
#pragma once

#include "codegen/kernel_ir.hpp"

namespace tessera::kir {

Expr exp_f32(Expr x);
Expr log_f32(Expr x);
Expr cos_f32(Expr x);
Expr sin_f32(Expr x);
// cos of 0 <= x < 2 pi with an f32 reduction: Box-Muller's angle (random_normal keeps its values).
Expr cos_f32_within_two_pi(Expr x);
Expr tanh_f32(Expr x);

}  // namespace tessera::kir
