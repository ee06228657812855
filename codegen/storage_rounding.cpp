#include "codegen/storage_rounding.hpp"

#include "codegen/kir_shorthand.hpp"

namespace tessera::kir {
namespace {

using namespace shorthand;

// Round-to-nearest-even of the non-negative f32 bit pattern `a`, dropping its low `bits` bits.
Expr round_low_bits(const Expr& a, int bits) {
  Expr lsb = band(shr(a, i32(bits)), i32(1));
  return band(add(a, add(i32((int64_t(1) << (bits - 1)) - 1), lsb)), i32(~((int64_t(1) << bits) - 1)));
}

// Rounded on the raw bits, sign included: a carry out of the magnitude only reaches the exponent
// (the largest finite values round to infinity), never the sign, so the sign needs no split.
// Eight integer operations a value, against ten with the sign taken apart first.
Expr round_to_bf16(const Expr& x) {
  Expr bits = bitcast(x, Type::I32);
  Expr a = band(bits, i32(0x7fffffff));
  Expr lsb = band(shr(a, i32(16)), i32(1));
  Expr rounded = bitcast(band(add(bits, add(i32(0x7fff), lsb)), i32(~int64_t(0xffff))), Type::F32);
  return select(lt(a, i32(0x7f800001)), rounded, x);  // NaN stays NaN
}

Expr round_to_f16(const Expr& x) {
  Expr bits = bitcast(x, Type::I32);
  Expr sign = band(bits, i32(INT32_MIN));
  Expr a = band(bits, i32(0x7fffffff));
  auto with_sign = [&](Expr magnitude_bits) { return bitcast(bor(std::move(magnitude_bits), sign), Type::F32); };
  // Normal halves: 10 mantissa bits of f32's 23 kept.
  Expr normal = with_sign(round_low_bits(a, 13));
  // Below the smallest normal half (2^-14): a multiple of 2^-24, rounded to nearest even from
  // the f32 mantissa, then exactly scaled back (at most 1024 * 2^-24).
  Expr exponent = shr(a, i32(23));
  Expr mantissa = bor(band(a, i32(0x7fffff)), i32(0x800000));
  // Clamped to [1, 24] so lanes that take another branch never shift out of range.
  Expr shift = binary(Op::Max, binary(Op::Min, binary(Op::Sub, i32(126), exponent), i32(24)), i32(1));
  Expr half = shr(mantissa, shift);
  Expr remainder = band(mantissa, binary(Op::Sub, binary(Op::Shl, i32(1), shift), i32(1)));
  Expr halfway = binary(Op::Shl, i32(1), binary(Op::Sub, shift, i32(1)));
  Expr up = binary(Op::Or, lt(halfway, remainder),
                   binary(Op::And, binary(Op::Eq, remainder, halfway), binary(Op::Eq, band(half, i32(1)), i32(1))));
  Expr units = add(half, select(up, i32(1), i32(0)));
  Expr subnormal_magnitude = binary(Op::Mul, cast(units, Type::F32), float_const(1.0 / 16777216.0, Type::F32));
  Expr subnormal = with_sign(bitcast(subnormal_magnitude, Type::I32));
  Expr zero = with_sign(i32(0));
  Expr infinity = with_sign(i32(0x7f800000));
  Expr finite = select(lt(a, i32(0x33000000)), zero,
                       select(lt(a, i32(0x38800000)), subnormal, select(lt(a, i32(0x477ff000)), normal, infinity)));
  return select(lt(a, i32(0x7f800000)), finite, x);  // infinities and NaNs as they are
}

}  // namespace

Expr round_to_storage(Expr x, Type storage) {
  if (storage == Type::BF16) return round_to_bf16(x);
  if (storage == Type::F16) return round_to_f16(x);
  return x;
}

}  // namespace tessera::kir
