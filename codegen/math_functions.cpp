#include "codegen/math_functions.hpp"

#include <cmath>

#include <limits>

#include "codegen/kir_shorthand.hpp"

namespace tessera::kir {
namespace {

using namespace shorthand;
Expr f(double v) { return f32(v); }
Expr i(int64_t v) { return i32(v); }

// Horner: c[0] * x^(n-1) + ... + c[n-1]
Expr polynomial(const Expr& x, std::initializer_list<double> coefficients) {
  Expr p;
  for (double c : coefficients) p = p ? add(mul(p, x), f(c)) : f(c);
  return p;
}

}  // namespace

Expr exp_f32(Expr x) {
  const double inf = std::numeric_limits<double>::infinity();
  Expr xc = binary(Op::Min, binary(Op::Max, x, f(-87.3365447)), f(88.7228391));
  Expr n = unary(Op::Floor, add(mul(xc, f(1.44269504088896341)), f(0.5)));
  Expr r = sub(sub(xc, mul(n, f(0.693359375))), mul(n, f(-2.12194440e-4)));
  Expr p = polynomial(r, {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3, 4.1665795894E-2, 1.6666665459E-1,
                          5.0000001201E-1});
  Expr e = add(add(mul(mul(p, r), r), r), f(1.0));
  // 2^n from the exponent bits.
  Expr scale = bitcast(binary(Op::Shl, add(cast(n, Type::I32), i(127)), i(23)), Type::F32);
  Expr result = mul(e, scale);
  result = select(binary(Op::Lt, f(88.7228391), x), f(inf), result);
  result = select(binary(Op::Lt, x, f(-87.3365447)), f(0.0), result);
  return select(binary(Op::Ne, x, x), x, result);  // NaN stays NaN
}

Expr log_f32(Expr x) {
  const double inf = std::numeric_limits<double>::infinity();
  Expr bits = bitcast(x, Type::I32);
  Expr exponent = cast(sub(binary(Op::BitAnd, binary(Op::AShr, bits, i(23)), i(0xff)), i(126)), Type::F32);
  Expr m = bitcast(binary(Op::BitOr, binary(Op::BitAnd, bits, i(0x807fffff)), i(0x3f000000)), Type::F32);  // [0.5, 1)
  Expr small = binary(Op::Lt, m, f(0.707106781186547524));
  exponent = select(small, sub(exponent, f(1.0)), exponent);
  m = select(small, sub(add(m, m), f(1.0)), sub(m, f(1.0)));
  Expr z = mul(m, m);
  Expr y = mul(mul(m, z), polynomial(m, {7.0376836292E-2, -1.1514610310E-1, 1.1676998740E-1, -1.2420140846E-1,
                                         1.4249322787E-1, -1.6668057665E-1, 2.0000714765E-1, -2.4999993993E-1,
                                         3.3333331174E-1}));
  y = add(y, mul(exponent, f(-2.12194440e-4)));
  y = sub(y, mul(z, f(0.5)));
  Expr result = add(add(m, y), mul(exponent, f(0.693359375)));
  result = select(binary(Op::Eq, x, f(inf)), x, result);
  result = select(binary(Op::Eq, x, f(0.0)), f(-inf), result);
  return select(binary(Op::Or, binary(Op::Lt, x, f(0.0)), binary(Op::Ne, x, x)), f(std::numeric_limits<double>::quiet_NaN()), result);
}

namespace {

// Cephes' sinf / cosf: |x| reduced to an octant by 4/pi, then the sine or the cosine polynomial
// on [-pi/4, pi/4] by octant, and the sign flips of the octant (and, for the sine, of x itself:
// sine is odd). The reduction is |x| - octant * pi/4: in f32, Cephes' three-part pi/4, which
// kernels that may reassociate (all but deterministic ones) fold back into one rounded constant
// (1e-4 off at |x| = 8000); in f64 (`wide`), one product and one difference, accurate as far as
// rotary angles reach whatever the compiler does.
Expr sin_or_cos_f32(Expr x, bool sine, bool wide) {
  Expr ax = unary(Op::Abs, x);
  Expr j, r;
  if (wide) {
    Expr ax64 = cast(ax, Type::F64);
    j = cast(binary(Op::Mul, ax64, float_const(4 / M_PI, Type::F64)), Type::I32);
    j = add(j, binary(Op::BitAnd, j, i(1)));  // to an even octant
    r = cast(binary(Op::Sub, ax64, binary(Op::Mul, cast(j, Type::F64), float_const(M_PI / 4, Type::F64))), Type::F32);
  } else {
    j = cast(mul(ax, f(1.27323954473516)), Type::I32);  // |x| * 4/pi
    j = add(j, binary(Op::BitAnd, j, i(1)));             // to an even octant
    Expr y = cast(j, Type::F32);
    r = sub(sub(sub(ax, mul(y, f(0.78515625))), mul(y, f(2.4187564849853515625e-4))), mul(y, f(3.77489497744594108e-8)));
  }
  j = binary(Op::BitAnd, j, i(7));
  Expr upper = binary(Op::Lt, i(3), j);
  j = select(upper, sub(j, i(4)), j);
  // Sign flips: cosine in octants 4-7, then 2-3; sine in octants 4-7 and for x < 0.
  Expr negate = sine ? binary(Op::Ne, upper, binary(Op::Lt, x, f(0.0))) : binary(Op::Ne, upper, binary(Op::Lt, i(1), j));
  Expr z = mul(r, r);
  Expr sin_poly = add(mul(mul(polynomial(z, {-1.9515295891E-4, 8.3321608736E-3, -1.6666654611E-1}), z), r), r);
  Expr cos_poly = add(sub(mul(mul(polynomial(z, {2.443315711809948E-005, -1.388731625493765E-003, 4.166664568298827E-002}), z), z),
                          mul(z, f(0.5))),
                      f(1.0));
  Expr middle = binary(Op::Or, binary(Op::Eq, j, i(1)), binary(Op::Eq, j, i(2)));  // near pi/2: the other function
  Expr v = sine ? select(middle, cos_poly, sin_poly) : select(middle, sin_poly, cos_poly);
  return select(negate, unary(Op::Neg, v), v);
}

}  // namespace

Expr cos_f32(Expr x) { return sin_or_cos_f32(x, false, true); }
Expr sin_f32(Expr x) { return sin_or_cos_f32(x, true, true); }
Expr cos_f32_within_two_pi(Expr x) { return sin_or_cos_f32(x, false, false); }

Expr tanh_f32(Expr x) {
  Expr ax = unary(Op::Abs, x);
  Expr z = mul(x, x);
  Expr small = add(mul(mul(polynomial(z, {-5.70498872745E-3, 2.06390887954E-2, -5.37397155531E-2, 1.33314422036E-1,
                                          -3.33332819422E-1}),
                           z),
                       x),
                   x);
  Expr e = exp_f32(add(ax, ax));
  Expr large = sub(f(1.0), binary(Op::Div, f(2.0), add(e, f(1.0))));
  large = select(binary(Op::Lt, x, f(0.0)), unary(Op::Neg, large), large);
  return select(binary(Op::Lt, ax, f(0.625)), small, large);
}

}  // namespace tessera::kir
