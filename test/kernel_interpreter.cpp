#include "kernel_interpreter.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "dsl/dtype.hpp"

namespace tessera::testing {
namespace {

using kir::Expr;
using kir::Op;
using kir::Stmt;
using kir::StmtPtr;
using kir::Type;

// A scalar: floats in `f` (an F32 is always a float's exact value), integers in `i`.
struct Value {
  double f = 0;
  int64_t i = 0;
};

// Integers wrap to their width, as machine arithmetic does.
int64_t wrap(int64_t v, Type t) {
  switch (t) {
    case Type::I1: return v & 1;
    case Type::U8: return int64_t(uint8_t(v));
    case Type::I32: return int64_t(int32_t(uint32_t(uint64_t(v))));
    default: return v;
  }
}

Value make_float(double v, Type t) { return {t == Type::F32 ? double(float(v)) : v, 0}; }
Value make_int(int64_t v, Type t) { return {0, wrap(v, t)}; }

class Interpreter {
 public:
  Interpreter(const kir::Kernel& k, void** buffers, const int64_t* params, int64_t begin, int64_t end)
      : k_(k), buffers_(buffers), params_(params), begin_(begin), end_(end), vars_(size_t(k.num_vars)) {}

  void run() { exec(k_.body); }

 private:
  Value load(int buffer, int64_t index) const {
    const std::byte* base = static_cast<const std::byte*>(buffers_[buffer]);
    switch (k_.buffers[size_t(buffer)].type) {
      case Type::F32: { float v; std::memcpy(&v, base + index * 4, 4); return {double(v), 0}; }
      case Type::F64: { double v; std::memcpy(&v, base + index * 8, 8); return {v, 0}; }
      case Type::I32: { int32_t v; std::memcpy(&v, base + index * 4, 4); return {0, v}; }
      case Type::I64: { int64_t v; std::memcpy(&v, base + index * 8, 8); return {0, v}; }
      case Type::U8: case Type::I1: return {0, int64_t(uint8_t(base[index]))};
      case Type::BF16: { uint16_t b; std::memcpy(&b, base + index * 2, 2); return {double(bf16_to_float(b)), 0}; }
      case Type::F16: { uint16_t b; std::memcpy(&b, base + index * 2, 2); return {double(f16_to_float(b)), 0}; }
    }
    throw std::logic_error("interpreter: bad buffer type");
  }

  void store(int buffer, int64_t index, Value v, Type from) {
    std::byte* base = static_cast<std::byte*>(buffers_[buffer]);
    const Type to = k_.buffers[size_t(buffer)].type;
    if (to == Type::BF16 || to == Type::F16) {
      // A store takes a value of the storage type, which the renderers only narrow
      // (codegen/kernel_ir.hpp, Store): a value lowering forgot to round would be truncated there.
      const float f = float(v.f);
      const uint16_t b = to == Type::BF16 ? float_to_bf16(f) : float_to_f16(f);
      if (!std::isnan(f) && (to == Type::BF16 ? bf16_to_float(b) : f16_to_float(b)) != f)
        throw std::logic_error("interpreter: a store of a value a 16-bit float cannot hold (lowering rounds it first)");
      std::memcpy(base + index * 2, &b, 2);
      return;
    }
    const Value c = convert(v, from, to);
    switch (to) {
      case Type::F32: { const float f = float(c.f); std::memcpy(base + index * 4, &f, 4); return; }
      case Type::F64: std::memcpy(base + index * 8, &c.f, 8); return;
      case Type::I32: { const int32_t x = int32_t(c.i); std::memcpy(base + index * 4, &x, 4); return; }
      case Type::I64: std::memcpy(base + index * 8, &c.i, 8); return;
      case Type::U8: case Type::I1: base[index] = std::byte(uint8_t(c.i)); return;
      default: throw std::logic_error("interpreter: bad store type");
    }
  }

  static Value convert(Value v, Type from, Type to) {
    if (from == to) return v;
    const bool ff = kir::is_float(from), ft = kir::is_float(to);
    if (to == Type::I1) return {0, ff ? int64_t(v.f != 0) : int64_t(v.i != 0)};
    if (ff && ft) return make_float(v.f, to);
    if (ff) return make_int(to == Type::U8 ? int64_t(uint8_t(v.f)) : int64_t(v.f), to);  // truncation
    const bool from_unsigned = from == Type::I1 || from == Type::U8;
    if (ft) return make_float(from_unsigned ? double(uint64_t(v.i)) : double(v.i), to);
    return make_int(v.i, to);
  }

  // Expressions are DAGs: a value shared by several uses is computed once per statement (the
  // variables cannot change inside one), or deep sharing would cost exponential time.
  Value eval(const Expr& e) {
    if (auto it = cache_.find(e.get()); it != cache_.end()) return it->second;
    const Value v = eval_uncached(e);
    cache_.emplace(e.get(), v);
    return v;
  }

  Value eval_uncached(const Expr& e) {
    const Type t = e->type;
    auto a = [&](size_t i) { return eval(e->args[i]); };
    auto floats = [&](auto f) { return make_float(f(a(0).f, e->args.size() > 1 ? a(1).f : 0.0), t); };
    switch (e->op) {
      case Op::IntConst: return make_int(e->iconst, t);
      case Op::FloatConst: return make_float(e->fconst, t);
      case Op::Var: return vars_[size_t(e->id)];
      case Op::Param: return {0, params_[e->id]};
      case Op::Load: return load(e->id, a(0).i);
      case Op::Neg: return kir::is_float(t) ? make_float(-a(0).f, t) : make_int(-a(0).i, t);
      case Op::Abs: return kir::is_float(t) ? make_float(std::fabs(a(0).f), t) : make_int(t == Type::U8 ? a(0).i : std::llabs(a(0).i), t);
      case Op::Exp: return floats([](double x, double) { return std::exp(x); });
      case Op::Log: return floats([](double x, double) { return std::log(x); });
      case Op::Sqrt: return floats([&](double x, double) { return t == Type::F32 ? double(std::sqrt(float(x))) : std::sqrt(x); });
      case Op::Tanh: return floats([](double x, double) { return std::tanh(x); });
      case Op::Cos: return floats([](double x, double) { return std::cos(x); });
      case Op::Sin: return floats([](double x, double) { return std::sin(x); });
      case Op::Floor: return floats([](double x, double) { return std::floor(x); });
      case Op::Bitcast: {
        const Value v = a(0);
        const Type from = e->args[0]->type;
        if (from == Type::F32 && t == Type::I32) return {0, int64_t(std::bit_cast<int32_t>(float(v.f)))};
        if (from == Type::I32 && t == Type::F32) return {double(std::bit_cast<float>(int32_t(v.i))), 0};
        if (from == Type::F64 && t == Type::I64) return {0, std::bit_cast<int64_t>(v.f)};
        if (from == Type::I64 && t == Type::F64) return {std::bit_cast<double>(v.i), 0};
        throw std::logic_error("interpreter: bad bitcast");
      }
      case Op::Shl: return make_int(int64_t(uint64_t(a(0).i) << a(1).i), t);
      case Op::AShr: return make_int(a(0).i >> a(1).i, t);
      case Op::BitAnd: return make_int(a(0).i & a(1).i, t);
      case Op::BitOr: return make_int(a(0).i | a(1).i, t);
      case Op::BitXor: return make_int(a(0).i ^ a(1).i, t);
      case Op::Add: return kir::is_float(t) ? floats(std::plus<double>()) : make_int(int64_t(uint64_t(a(0).i) + uint64_t(a(1).i)), t);
      case Op::Sub: return kir::is_float(t) ? floats(std::minus<double>()) : make_int(int64_t(uint64_t(a(0).i) - uint64_t(a(1).i)), t);
      case Op::Mul: return kir::is_float(t) ? floats(std::multiplies<double>()) : make_int(int64_t(uint64_t(a(0).i) * uint64_t(a(1).i)), t);
      case Op::MulWide: return make_int(int64_t(uint64_t(uint32_t(a(0).i)) * uint64_t(uint32_t(a(1).i))), t);
      case Op::Div:
        if (kir::is_float(t)) return floats(std::divides<double>());
        return make_int(a(0).i / a(1).i, t);
      case Op::Rem: return make_int(a(0).i % a(1).i, t);
      // A NaN operand gives NaN (numpy's maximum / minimum).
      case Op::Max:
        if (kir::is_float(t)) return floats([](double x, double y) { return std::isnan(x) ? x : std::isnan(y) ? y : std::max(x, y); });
        return make_int(std::max(a(0).i, a(1).i), t);
      case Op::Min:
        if (kir::is_float(t)) return floats([](double x, double y) { return std::isnan(x) ? x : std::isnan(y) ? y : std::min(x, y); });
        return make_int(std::min(a(0).i, a(1).i), t);
      case Op::Pow: return floats([&](double x, double y) { return t == Type::F32 ? double(std::pow(float(x), float(y))) : std::pow(x, y); });
      case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: {
        const Value x = a(0), y = a(1);
        const bool fl = kir::is_float(e->args[0]->type);
        bool r = false;
        switch (e->op) {
          case Op::Eq: r = fl ? x.f == y.f : x.i == y.i; break;
          case Op::Ne: r = fl ? !(x.f == y.f) : x.i != y.i; break;  // unordered: NaN != NaN
          case Op::Lt: r = fl ? x.f < y.f : x.i < y.i; break;
          default: r = fl ? x.f <= y.f : x.i <= y.i; break;
        }
        return {0, int64_t(r)};
      }
      case Op::And: return {0, a(0).i & a(1).i};
      case Op::Or: return {0, a(0).i | a(1).i};
      case Op::Select: return a(0).i ? a(1) : a(2);
      case Op::Cast: return convert(a(0), e->args[0]->type, t);
    }
    throw std::logic_error("interpreter: bad op");
  }

  void exec(const StmtPtr& s) {
    cache_.clear();
    switch (s->kind) {
      case Stmt::Kind::Block:
        for (const auto& child : s->body) exec(child);
        return;
      case Stmt::Kind::Store: store(s->buffer, eval(s->a).i, eval(s->b), s->b->type); return;
      case Stmt::Kind::Declare: case Stmt::Kind::Assign: vars_[size_t(s->var)] = eval(s->a); return;
      case Stmt::Kind::For: {
        const int64_t lo = s->is_range_loop() ? begin_ : eval(s->a).i, hi = s->is_range_loop() ? end_ : eval(s->b).i;
        for (int64_t i = lo; i < hi; ++i) {
          cache_.clear();
          vars_[size_t(s->var)] = {0, i};
          for (const auto& child : s->body) exec(child);
        }
        return;
      }
    }
  }

  const kir::Kernel& k_;
  void** buffers_;
  const int64_t* params_;
  int64_t begin_, end_;
  std::vector<Value> vars_;
  std::unordered_map<const kir::ExprNode*, Value> cache_;
};

}  // namespace

void interpret_kernel(const kir::Kernel& kernel, void** buffers, const int64_t* params, int64_t begin, int64_t end) {
  Interpreter(kernel, buffers, params, begin, end).run();
}

}  // namespace tessera::testing
