#include "codegen/philox.hpp"

#include "dsl/error.hpp"

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

// The ten rounds under round keys `key_word(word, round)` (word 0 or 1). Words are I32 values:
// 32-bit xors and one widening multiply per product, as each target's instructions do them.
// (With I64 words NVVM keeps the xors and multiplies 64-bit: a fifth more instructions for
// sm_90.)
template <class KeyWord>
std::array<Expr, 4> philox_rounds(const Expr& counter, KeyWord key_word) {
  std::array<Expr, 4> c = {cast(counter, Type::I32), cast(binary(Op::AShr, counter, int_const(32)), Type::I32), word(0), word(0)};
  Product p0, p1;
  for (uint32_t round = 0; round < 10; ++round) {
    p0 = multiply(kMultiplier0, c[0]);
    p1 = multiply(kMultiplier1, c[2]);
    c = {bit_xor(bit_xor(p1.hi, c[1]), key_word(0, round)), p1.lo, bit_xor(bit_xor(p0.hi, c[3]), key_word(1, round)), p0.lo};
  }
  return {unsigned_value(cast(c[0], Type::I64)), p1.lo_unsigned, unsigned_value(cast(c[2], Type::I64)), p0.lo_unsigned};
}

// The key's step per round of word 0 or 1, as 32-bit arithmetic wraps it.
uint32_t weyl_step(int key_word, uint32_t round) { return (key_word == 0 ? kWeyl0 : kWeyl1) * round; }

}  // namespace

std::array<Expr, 4> philox(const Expr& counter, uint64_t key) {
  return philox_rounds(counter, [&](int w, uint32_t round) { return word(uint32_t(key >> (32 * w)) + weyl_step(w, round)); });
}

std::array<Expr, 4> philox(const Expr& counter, const Expr& key) {
  if (key->type != Type::I64) throw InternalError("philox: the key must be an I64");
  // Each round key as an I64 below 2^33 (a 32-bit half plus a 32-bit step), cast to I32 to wrap.
  const std::array<Expr, 2> halves = {binary(Op::BitAnd, key, int_const(0xffffffff)),
                                      binary(Op::BitAnd, binary(Op::AShr, key, int_const(32)), int_const(0xffffffff))};
  return philox_rounds(counter, [&](int w, uint32_t round) {
    const Expr& half = halves[size_t(w)];
    return cast(round == 0 ? half : binary(Op::Add, half, int_const(int64_t(weyl_step(w, round)))), Type::I32);
  });
}

}  // namespace tessera::kir
