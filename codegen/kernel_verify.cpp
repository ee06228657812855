#include "codegen/kernel_verify.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <vector>

#include "dsl/error.hpp"

namespace tessera::kir {
namespace {

bool is_integer(Type t) { return t == Type::I32 || t == Type::I64 || t == Type::U8; }

bool same_width(Type a, Type b) {
  auto width = [](Type t) { return t == Type::I32 || t == Type::F32 ? 4 : t == Type::I64 || t == Type::F64 ? 8 : 0; };
  return width(a) != 0 && width(a) == width(b);
}

// Variables an expression reads, with the type it reads each as.
using VarUses = std::vector<std::pair<int, Type>>;

class Verifier {
 public:
  explicit Verifier(const Kernel& k) : k_(k) {}

  void run() {
    if (!k_.body) fail("no body");
    for (size_t b = 0; b < k_.buffers.size(); ++b)
      if (k_.buffers[b].type == Type::I1) fail(fmt::format("buffer {} has type i1 (predicates live in registers)", b));
    if (k_.status_buffer != -1 &&
        (k_.status_buffer < 0 || size_t(k_.status_buffer) >= k_.buffers.size() || k_.buffers[size_t(k_.status_buffer)].type != Type::I64 ||
         !k_.buffers[size_t(k_.status_buffer)].output))
      fail(fmt::format("status buffer {} is not an i64 output buffer", k_.status_buffer));
    if (!k_.outer_extent) fail("no range loop trip count");
    if (!uses(k_.outer_extent).empty()) fail("the range loop's trip count reads a variable");
    expect_type(k_.outer_extent, Type::I64, "the range loop's trip count");
    std::vector<std::optional<Type>> scope(size_t(std::max(k_.num_vars, 0)));
    statement(k_.body, scope, /*inside_loop=*/false);
    if (range_loops_ != 1) fail(fmt::format("{} range loops (exactly one runs over the ABI's [begin, end))", range_loops_));
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { throw InternalError(fmt::format("kernel {}: {}", k_.name, why)); }

  void expect_type(const Expr& e, Type t, const char* what) {
    if (e->type != t) fail(fmt::format("{} has type {}, not {}", what, type_name(e->type), type_name(t)));
  }

  void check_var(int id) const {
    if (id < 0 || id >= k_.num_vars) fail(fmt::format("variable v{} outside [0, {})", id, k_.num_vars));
  }

  // The expression's own rules, once per node (expressions are shared DAGs); its variable uses.
  const VarUses& uses(const Expr& e) {
    if (auto it = memo_.find(e.get()); it != memo_.end()) return it->second;
    VarUses out;
    for (const Expr& a : e->args) {
      if (!a) fail("an expression with a missing operand");
      for (const auto& u : uses(a)) out.push_back(u);
    }
    expression(*e);
    if (e->op == Op::Var) out.push_back({e->id, e->type});
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return memo_[e.get()] = std::move(out);
  }

  void expression(const ExprNode& e) {
    auto arg = [&](size_t i) { return e.args[i]->type; };
    auto mismatch = [&](const char* rule) {
      std::string types;
      for (const Expr& a : e.args) types += std::string(types.empty() ? "" : ", ") + std::string(type_name(a->type));
      fail(fmt::format("op {} of type {} on ({}): {}", op_name(e.op), type_name(e.type), types, rule));
    };
    if (op_arity(e.op) < 0) fail(fmt::format("unknown op {}", int(e.op)));
    if (e.args.size() != size_t(op_arity(e.op)))
      fail(fmt::format("op {} with {} operands, not {}", op_name(e.op), e.args.size(), op_arity(e.op)));
    switch (e.op) {
      case Op::IntConst: if (is_float(e.type)) mismatch("an integer constant of a float type"); return;
      case Op::FloatConst: if (e.type != Type::F32 && e.type != Type::F64) mismatch("float constants are f32 or f64"); return;
      case Op::Var: check_var(e.id); return;
      case Op::Param: if (e.type != Type::I64 || e.id < 0) mismatch("parameters are i64 slots"); return;
      case Op::Load:
        if (e.id < 0 || size_t(e.id) >= k_.buffers.size()) fail(fmt::format("load of buffer {} of {}", e.id, k_.buffers.size()));
        if (arg(0) != Type::I64) mismatch("an index is i64");
        if (e.type != compute_type(k_.buffers[size_t(e.id)].type)) mismatch("a load has its buffer's compute type");
        return;
      case Op::Neg: case Op::Abs: case Op::Floor:
        if (arg(0) != e.type || (e.op == Op::Floor && !is_float(e.type))) mismatch("a unary op keeps its operand's type");
        return;
      case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Tanh: case Op::Cos: case Op::Sin:
        if (arg(0) != e.type || !is_float(e.type)) mismatch("a math function maps a float to its own type");
        return;
      case Op::Bitcast: if (!same_width(arg(0), e.type)) mismatch("a bitcast keeps the width"); return;
      case Op::Shl: case Op::AShr: case Op::BitAnd: case Op::BitOr: case Op::BitXor:
        if (arg(0) != e.type || arg(1) != e.type || !is_integer(e.type)) mismatch("bit operations take and give one integer type");
        return;
      case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Rem: case Op::Max: case Op::Min: case Op::Pow:
        if (arg(0) != e.type || arg(1) != e.type || e.type == Type::I1) mismatch("arithmetic takes and gives one type");
        return;
      case Op::MulWide:
        if (arg(0) != Type::I32 || arg(1) != Type::I32 || e.type != Type::I64) mismatch("mulwide takes two i32 and gives i64");
        return;
      case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::And: case Op::Or:
        if (arg(0) != arg(1) || e.type != Type::I1) mismatch("a predicate compares one type and gives i1");
        return;
      case Op::Select:
        if (arg(0) != Type::I1 || arg(1) != e.type || arg(2) != e.type) mismatch("select takes an i1 and two values of its type");
        return;
      case Op::Cast: return;
    }
    fail(fmt::format("unknown op {}", int(e.op)));
  }

  // Every variable `e` reads is declared in `scope`, with the type it is read as.
  void in_scope(const Expr& e, const std::vector<std::optional<Type>>& scope, const char* where) {
    if (!e) fail(fmt::format("{}: missing expression", where));
    for (const auto& [id, type] : uses(e)) {
      if (!scope[size_t(id)]) fail(fmt::format("{} reads v{} before it is declared", where, id));
      if (*scope[size_t(id)] != type)
        fail(fmt::format("{} reads v{} as {}, declared {}", where, id, type_name(type), type_name(*scope[size_t(id)])));
    }
  }

  // `scope`: the variables declared so far, in enclosing scopes and earlier in this one.
  void statement(const StmtPtr& s, std::vector<std::optional<Type>>& scope, bool inside_loop) {
    if (!s) fail("a missing statement");
    switch (s->kind) {
      case Stmt::Kind::Block: {
        std::vector<std::optional<Type>> inner = scope;
        for (const StmtPtr& b : s->body) statement(b, inner, inside_loop);
        return;
      }
      case Stmt::Kind::For: {
        check_var(s->var);
        in_scope(s->a, scope, "a loop's begin");
        in_scope(s->b, scope, "a loop's end");
        expect_type(s->a, Type::I64, "a loop's begin");
        expect_type(s->b, Type::I64, "a loop's end");
        if (s->is_range_loop()) {
          if (inside_loop) fail(fmt::format("the range loop over v{} is nested in another loop", s->var));
          ++range_loops_;
        }
        if (s->loop == LoopKind::Lanes) {
          if (!in_warp_loop_) fail(fmt::format("the lanes loop over v{} is not inside a gpu_warp or gpu_block range loop", s->var));
          if (in_lanes_loop_) fail(fmt::format("the lanes loop over v{} is inside another lanes loop", s->var));
          if (s->reduce_var < 0 || size_t(s->reduce_var) >= scope.size() || !scope[size_t(s->reduce_var)])
            fail(fmt::format("the lanes loop over v{} combines v{}, not declared before it", s->var, s->reduce_var));
          if (s->reduce_op != Op::Add && s->reduce_op != Op::Mul && s->reduce_op != Op::Max && s->reduce_op != Op::Min)
            fail(fmt::format("the lanes loop over v{} combines with op {}", s->var, int(s->reduce_op)));
          if (s->lanes_in_order && !in_gpu_warp_loop_) fail(fmt::format("the in-order lanes loop over v{} is not in a gpu_warp loop", s->var));
        }
        const bool was_in_warp_loop = in_warp_loop_, was_in_lanes_loop = in_lanes_loop_;
        const bool was_in_gpu_warp_loop = in_gpu_warp_loop_;
        in_warp_loop_ |= s->loop == LoopKind::GpuWarp || s->loop == LoopKind::GpuBlock;
        in_gpu_warp_loop_ |= s->loop == LoopKind::GpuWarp;
        in_lanes_loop_ |= s->loop == LoopKind::Lanes;
        std::vector<std::optional<Type>> inner = scope;
        inner[size_t(s->var)] = Type::I64;
        for (const StmtPtr& b : s->body) statement(b, inner, true);
        in_warp_loop_ = was_in_warp_loop;
        in_lanes_loop_ = was_in_lanes_loop;
        in_gpu_warp_loop_ = was_in_gpu_warp_loop;
        return;
      }
      case Stmt::Kind::Store: {
        if (s->buffer < 0 || size_t(s->buffer) >= k_.buffers.size()) fail(fmt::format("store to buffer {} of {}", s->buffer, k_.buffers.size()));
        const Buffer& b = k_.buffers[size_t(s->buffer)];
        if (!b.output) fail(fmt::format("store to input buffer {}", s->buffer));
        in_scope(s->a, scope, "a store's index");
        in_scope(s->b, scope, "a stored value");
        expect_type(s->a, Type::I64, "a store's index");
        if (s->b->type != compute_type(b.type))
          fail(fmt::format("a {} value stored to buffer {} of {}", type_name(s->b->type), s->buffer, type_name(b.type)));
        return;
      }
      case Stmt::Kind::Declare:
        check_var(s->var);
        in_scope(s->a, scope, "a declaration's value");
        if (scope[size_t(s->var)]) fail(fmt::format("v{} declared twice in one scope", s->var));
        if (s->a->type != s->type)
          fail(fmt::format("v{} declared {} from a {} value", s->var, type_name(s->type), type_name(s->a->type)));
        scope[size_t(s->var)] = s->type;
        return;
      case Stmt::Kind::Assign:
        check_var(s->var);
        in_scope(s->a, scope, "an assigned value");
        if (!scope[size_t(s->var)]) fail(fmt::format("v{} assigned before it is declared", s->var));
        if (s->a->type != *scope[size_t(s->var)])
          fail(fmt::format("v{} of type {} assigned a {} value", s->var, type_name(*scope[size_t(s->var)]), type_name(s->a->type)));
        return;
    }
    fail("an unknown statement");
  }

  const Kernel& k_;
  std::unordered_map<const ExprNode*, VarUses> memo_;
  int range_loops_ = 0;
  bool in_warp_loop_ = false;
  bool in_lanes_loop_ = false;
  bool in_gpu_warp_loop_ = false;  // in-order lanes: a warp's 32, each at most one iteration
};

}  // namespace

void verify(const Kernel& kernel) { Verifier(kernel).run(); }

}  // namespace tessera::kir
