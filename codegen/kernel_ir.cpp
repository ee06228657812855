#include "codegen/kernel_ir.hpp"

#include <fmt/format.h>

#include <map>

#include "codegen/kernel_verify.hpp"
#include "dsl/error.hpp"
#include "dsl/release_iteratively.hpp"

namespace tessera::kir {

Type type_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return Type::F32;
    case DType::f64: return Type::F64;
    case DType::i32: return Type::I32;
    case DType::i64: return Type::I64;
    case DType::u8: return Type::U8;
    case DType::bf16: return Type::BF16;
    case DType::f16: return Type::F16;
  }
  throw InternalError("type_of: bad dtype");
}

Type compute_type(Type storage) { return storage == Type::BF16 || storage == Type::F16 ? Type::F32 : storage; }
bool is_float(Type t) { return t == Type::F32 || t == Type::F64 || t == Type::BF16 || t == Type::F16; }

std::string_view type_name(Type t) {
  switch (t) {
    case Type::I1: return "i1";
    case Type::I32: return "i32";
    case Type::I64: return "i64";
    case Type::U8: return "u8";
    case Type::F32: return "f32";
    case Type::F64: return "f64";
    case Type::BF16: return "bf16";
    case Type::F16: return "f16";
  }
  return "?";
}

std::string_view op_name(Op op) {
  switch (op) {
#define TESSERA_KIR_OP_NAME(name, text, operands) case Op::name: return text;
    TESSERA_KIR_OPS(TESSERA_KIR_OP_NAME)
#undef TESSERA_KIR_OP_NAME
  }
  return "?";
}

int op_arity(Op op) {
  switch (op) {
#define TESSERA_KIR_OP_ARITY(name, text, operands) case Op::name: return operands;
    TESSERA_KIR_OPS(TESSERA_KIR_OP_ARITY)
#undef TESSERA_KIR_OP_ARITY
  }
  return -1;
}

namespace {

Expr make(Op op, Type type, std::vector<Expr> args = {}) {
  auto e = std::make_shared<ExprNode>();
  e->op = op;
  e->type = type;
  e->args = std::move(args);
  return e;
}

bool is_predicate(Op op) {
  return op == Op::Eq || op == Op::Ne || op == Op::Lt || op == Op::Le || op == Op::And || op == Op::Or;
}


// Prints expressions as a DAG: a subexpression used more than once is written in full the first
// time as %N=(...) and as %N afterwards, so shared values (inlined into several consumers) keep
// the text linear in the kernel's size. The numbering follows the traversal: canonical.
struct Printer {
  std::map<const ExprNode*, int> uses;
  std::map<const ExprNode*, int> names;

  void count(const Expr& e) {
    if (uses[e.get()]++ > 0) return;
    for (const auto& a : e->args) count(a);
  }
  void count(const StmtPtr& s) {
    for (const Expr* e : {&s->a, &s->b})
      if (*e) count(*e);
    for (const auto& b : s->body) count(b);
  }

  void print(const Expr& e, std::string& out) {
    switch (e->op) {
      case Op::IntConst: out += fmt::format("{}:{}", e->iconst, type_name(e->type)); return;
      case Op::FloatConst: out += fmt::format("{}:{}", e->fconst, type_name(e->type)); return;
      case Op::Var: out += fmt::format("v{}", e->id); return;
      case Op::Param: out += fmt::format("p{}", e->id); return;
      default: break;
    }
    if (auto it = names.find(e.get()); it != names.end()) {
      out += fmt::format("%{}", it->second);
      return;
    }
    if (uses[e.get()] > 1) {
      int name = int(names.size());
      names[e.get()] = name;
      out += fmt::format("%{}=", name);
    }
    out += op_name(e->op);
    out += fmt::format(".{}", type_name(e->type));
    if (e->op == Op::Load) out += fmt::format("[b{}]", e->id);
    out += '(';
    for (size_t i = 0; i < e->args.size(); ++i) {
      if (i) out += ", ";
      print(e->args[i], out);
    }
    out += ')';
  }

  void print(const StmtPtr& s, int indent, std::string& out) {
  std::string pad(indent * 2, ' ');
  switch (s->kind) {
    case Stmt::Kind::Block:
      for (const auto& b : s->body) print(b, indent, out);
      return;
    case Stmt::Kind::For:
      if (s->loop == LoopKind::Lanes)
        out += pad + fmt::format("for lanes{}(v{} {}) v{} in [", s->lanes_in_order ? "_in_order" : "", s->reduce_var, int(s->reduce_op), s->var);
      else
        out += pad + fmt::format("for{}{} v{} in [", s->is_range_loop() || s->independent ? " " : "",
                                 s->is_range_loop() ? loop_kind_name(s->loop) : s->independent ? "independent" : "", s->var);
      print(s->a, out);
      out += ", ";
      print(s->b, out);
      out += ")\n";
      for (const auto& b : s->body) print(b, indent + 1, out);
      return;
    case Stmt::Kind::Store:
      out += pad + fmt::format("b{}[", s->buffer);
      print(s->a, out);
      out += "] = ";
      print(s->b, out);
      out += "\n";
      return;
    case Stmt::Kind::Declare:
      out += pad + fmt::format("{} v{} = ", type_name(s->type), s->var);
      print(s->a, out);
      out += "\n";
      return;
    case Stmt::Kind::Assign:
      out += pad + fmt::format("v{} = ", s->var);
      print(s->a, out);
      out += "\n";
      return;
  }
  }
};

}  // namespace

namespace {

Expr leaf(Op op, Type type, int64_t iconst, double fconst, int id) {
  auto e = std::make_shared<ExprNode>();
  e->op = op;
  e->type = type;
  e->iconst = iconst;
  e->fconst = fconst;
  e->id = id;
  return e;
}

}  // namespace

ExprNode::~ExprNode() { release_iteratively(args); }

Expr int_const(int64_t v, Type t) { return leaf(Op::IntConst, t, v, 0, 0); }
Expr float_const(double v, Type t) { return leaf(Op::FloatConst, compute_type(t), 0, v, 0); }
Expr var(int id, Type t) { return leaf(Op::Var, t, 0, 0, id); }
Expr param(int slot) { return leaf(Op::Param, Type::I64, 0, 0, slot); }

Expr load(int buffer, Type storage, Expr index) {
  auto e = std::make_shared<ExprNode>();
  e->op = Op::Load;
  e->type = compute_type(storage);
  e->id = buffer;
  e->args = {std::move(index)};
  return e;
}

Expr unary(Op op, Expr a) {
  Type t = a->type;
  return make(op, t, {std::move(a)});
}

Expr binary(Op op, Expr a, Expr b) {
  if (a->type != b->type)
    throw InternalError(fmt::format("kernel IR: {} of {} and {}", op_name(op), type_name(a->type), type_name(b->type)));
  // Fold integer index arithmetic on constants: keeps loops and addresses simple.
  if (a->op == Op::IntConst && b->op == Op::IntConst && !is_predicate(op)) {
    int64_t x = a->iconst, y = b->iconst;
    switch (op) {
      case Op::Add: return int_const(x + y, a->type);
      case Op::Sub: return int_const(x - y, a->type);
      case Op::Mul: return int_const(x * y, a->type);
      case Op::Div: if (y != 0) return int_const(x / y, a->type); break;
      case Op::Rem: if (y != 0) return int_const(x % y, a->type); break;
      case Op::Max: return int_const(std::max(x, y), a->type);
      case Op::Min: return int_const(std::min(x, y), a->type);
      default: break;
    }
  }
  if (a->type == Type::I64 && !is_predicate(op)) {
    auto is = [](const Expr& e, int64_t v) { return e->op == Op::IntConst && e->iconst == v; };
    if (op == Op::Add && is(a, 0)) return b;
    if ((op == Op::Add || op == Op::Sub) && is(b, 0)) return a;
    if (op == Op::Mul && (is(a, 0) || is(b, 0))) return int_const(0);
    if (op == Op::Mul && is(a, 1)) return b;
    if ((op == Op::Mul || op == Op::Div) && is(b, 1)) return a;
    if (op == Op::Rem && is(b, 1)) return int_const(0);
  }
  Type t = is_predicate(op) ? Type::I1 : op == Op::MulWide ? Type::I64 : a->type;
  return make(op, t, {std::move(a), std::move(b)});
}

Expr select(Expr c, Expr a, Expr b) {
  if (c->op == Op::IntConst) return c->iconst ? a : b;
  Type t = a->type;
  return make(Op::Select, t, {std::move(c), std::move(a), std::move(b)});
}

Expr cast(Expr a, Type t) {
  if (a->type == t) return a;
  if (a->op == Op::IntConst && !is_float(t) && t != Type::I1) return int_const(a->iconst, t);
  return make(Op::Cast, t, {std::move(a)});
}

Expr bitcast(Expr a, Type t) { return make(Op::Bitcast, t, {std::move(a)}); }

StmtPtr block(std::vector<StmtPtr> body) {
  auto s = std::make_shared<Stmt>();
  s->kind = Stmt::Kind::Block;
  s->body = std::move(body);
  return s;
}

StmtPtr for_loop(int v, Expr begin, Expr end, std::vector<StmtPtr> body, LoopKind loop) {
  auto s = std::make_shared<Stmt>();
  s->kind = Stmt::Kind::For;
  s->var = v;
  s->a = std::move(begin);
  s->b = std::move(end);
  s->body = std::move(body);
  s->loop = loop;
  return s;
}

StmtPtr store(int buffer, Expr index, Expr value) {
  auto s = std::make_shared<Stmt>();
  s->kind = Stmt::Kind::Store;
  s->buffer = buffer;
  s->a = std::move(index);
  s->b = std::move(value);
  return s;
}

StmtPtr declare(int v, Type type, Expr init) {
  auto s = std::make_shared<Stmt>();
  s->kind = Stmt::Kind::Declare;
  s->var = v;
  s->type = type;
  s->a = std::move(init);
  return s;
}

StmtPtr assign(int v, Expr value) {
  auto s = std::make_shared<Stmt>();
  s->kind = Stmt::Kind::Assign;
  s->var = v;
  s->a = std::move(value);
  return s;
}

bool equal(const Expr& a, const Expr& b) {
  if (a == b) return true;
  if (a->op != b->op || a->type != b->type || a->iconst != b->iconst || a->fconst != b->fconst || a->id != b->id ||
      a->args.size() != b->args.size())
    return false;
  for (size_t i = 0; i < a->args.size(); ++i)
    if (!equal(a->args[i], b->args[i])) return false;
  return true;
}

int64_t evaluate(const Expr& e, const int64_t* params) {
  switch (e->op) {
    case Op::IntConst: return e->iconst;
    case Op::Param: return params[e->id];
    case Op::Add: return evaluate(e->args[0], params) + evaluate(e->args[1], params);
    case Op::Sub: return evaluate(e->args[0], params) - evaluate(e->args[1], params);
    case Op::Mul: return evaluate(e->args[0], params) * evaluate(e->args[1], params);
    case Op::Max: return std::max(evaluate(e->args[0], params), evaluate(e->args[1], params));
    case Op::Min: return std::min(evaluate(e->args[0], params), evaluate(e->args[1], params));
    default: throw InternalError("kir::evaluate: not an integer expression of constants and parameters");
  }
}

std::string Kernel::to_string() const {
  std::string out = "kernel(";
  for (size_t i = 0; i < buffers.size(); ++i)
    out += fmt::format("{}b{}:{}{}{}", i ? ", " : "", i, type_name(buffers[i].type), buffers[i].output ? " out" : "",
                       buffers[i].may_alias ? " may_alias" : "");
  out += fmt::format(") vars={} ordered={} range=", num_vars, ordered_reductions);
  if (status_buffer >= 0) out = fmt::format("{} status=b{} range=", out.substr(0, out.size() - 7), status_buffer);
  Printer printer;
  if (outer_extent) printer.count(outer_extent);
  printer.count(body);
  if (outer_extent) printer.print(outer_extent, out);
  out += "\n";
  printer.print(body, 1, out);
  return out;
}

bool is_gpu_range(LoopKind kind) {
  return kind == LoopKind::GpuThread || kind == LoopKind::GpuWarp || kind == LoopKind::GpuBlock;
}

std::string_view loop_kind_name(LoopKind kind) {
  switch (kind) {
    case LoopKind::Serial: return "serial";
    case LoopKind::Parallel: return "parallel";
    case LoopKind::Ordered: return "ordered";
    case LoopKind::GpuThread: return "gpu_thread";
    case LoopKind::GpuWarp: return "gpu_warp";
    case LoopKind::GpuBlock: return "gpu_block";
    case LoopKind::Lanes: return "lanes";
  }
  return "?";
}

namespace {

// The range loop: at the top of the body, possibly inside blocks.
Stmt* find_range_loop(const StmtPtr& s) {
  if (!s) return nullptr;
  if (s->is_range_loop()) return s.get();
  if (s->kind != Stmt::Kind::Block) return nullptr;
  for (const auto& b : s->body)
    if (Stmt* found = find_range_loop(b)) return found;
  return nullptr;
}

StmtPtr copy_tree(const StmtPtr& s) {
  auto out = std::make_shared<Stmt>(*s);
  for (auto& b : out->body) b = copy_tree(b);
  return out;
}

// A CPU runs a warp's lanes as one thread: their loops are serial.
void lanes_to_serial(Stmt& s) {
  if (s.loop == LoopKind::Lanes) s.loop = LoopKind::Serial;
  for (auto& b : s.body) lanes_to_serial(*b);
}

}  // namespace

LoopKind Kernel::range_loop() const {
  const Stmt* loop = find_range_loop(body);
  if (!loop) throw InternalError("kernel " + name + " has no range loop");
  return loop->loop;
}

Kernel retargeted(Kernel kernel, LoopTarget target) {
  kernel.body = copy_tree(kernel.body);  // statements are shared: never rewrite the CPU kernel's
  Stmt* loop = find_range_loop(kernel.body);
  if (!loop) throw InternalError("kernel " + kernel.name + " has no range loop");
  if (target == LoopTarget::Cuda && loop->loop == LoopKind::Parallel) loop->loop = LoopKind::GpuThread;
  if (target == LoopTarget::Cpu && is_gpu_range(loop->loop)) loop->loop = LoopKind::Parallel;
  if (target == LoopTarget::Cpu) lanes_to_serial(*kernel.body);
  return kernel;
}

Kernel for_target(Kernel kernel, LoopTarget target) {
  kernel = retargeted(std::move(kernel), target);
  verify(kernel);
  return kernel;
}

}  // namespace tessera::kir
