#include "codegen/philox.hpp"

namespace tessera::kir {
namespace {

constexpr uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // the key's step per round

Expr word(uint32_t v) { return int_const(int64_t(v), Type::I32); }
bool is_zero(const Expr& e) { return e->op == Op::IntConst && e->iconst == 0; }

// Zero words (the first round's) fold away.
Expr bit_xor(Expr a, Expr b) {
  if (is_zero(a)) return b;
  if (is_zero(b)) return a;
  return binary(Op::BitXor, std::move(a), std::move(b));
}

// The low 32 bits of an I64 as an output word in [0, 2^32) (after a cast of an I32 word, whose
// sign extension this undoes).
Expr unsigned_value(Expr w) { return binary(Op::BitAnd, std::move(w), int_const(0xffffffff)); }

struct Product {
  Expr hi, lo;       // words (casts to I32 keep the low 32 bits)
  Expr lo_unsigned;  // lo as an output word, straight from the product
};

// The 64-bit product of two words, as its halves.
Product multiply(uint32_t m, const Expr& w) {
  if (is_zero(w)) return {word(0), word(0), int_const(0)};
  Expr p = binary(Op::MulWide, w, word(m));
  return {cast(binary(Op::AShr, p, int_const(32)), Type::I32), cast(p, Type::I32), unsigned_value(p)};
}

}  // namespace

// Words are I32 values: 32-bit xors and one widening multiply per product, as each target's
// instructions do them. (With I64 words NVVM keeps the xors and multiplies 64-bit: a fifth more
// instructions for sm_90.)
std::array<Expr, 4> philox(const Expr& counter, uint64_t key) {
  std::array<Expr, 4> c = {cast(counter, Type::I32), cast(binary(Op::AShr, counter, int_const(32)), Type::I32), word(0), word(0)};
  uint32_t k0 = uint32_t(key), k1 = uint32_t(key >> 32);
  Product p0, p1;
  for (int round = 0; round < 10; ++round) {
    p0 = multiply(kMultiplier0, c[0]);
    p1 = multiply(kMultiplier1, c[2]);
    c = {bit_xor(bit_xor(p1.hi, c[1]), word(k0)), p1.lo, bit_xor(bit_xor(p0.hi, c[3]), word(k1)), p0.lo};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {unsigned_value(cast(c[0], Type::I64)), p1.lo_unsigned, unsigned_value(cast(c[2], Type::I64)), p0.lo_unsigned};
}

}  // namespace tessera::kir
