#include "codegen/cuda_renderer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <bit>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include "codegen/cuda_prelude.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

using namespace kir;

// The C type of a value (bf16/f16 values are f32: they exist only in memory).
std::string value_type(Type t) {
  switch (t) {
    case Type::I1: return "bool";
    case Type::I32: return "int32_t";
    case Type::I64: return "int64_t";
    case Type::U8: return "uint8_t";
    case Type::F32: case Type::BF16: case Type::F16: return "float";
    case Type::F64: return "double";
  }
  throw InternalError("cuda renderer: bad type");
}

// The C type of a buffer element: bf16/f16 as raw bits, converted by the prelude.
std::string storage_type(Type t) {
  switch (t) {
    case Type::BF16: case Type::F16: return "uint16_t";
    case Type::I1: return "uint8_t";
    default: return value_type(t);
  }
}

// Integer arithmetic runs in the unsigned type and is narrowed back, so it wraps as LLVM's
// (and the interpreter's) does instead of being undefined signed overflow.
std::string unsigned_type(Type t) { return t == Type::I64 ? "uint64_t" : "uint32_t"; }
std::string narrow(Type t, const std::string& text) {
  if (t == Type::I1) return fmt::format("((({}) & 1u) != 0u)", text);
  return fmt::format("({})({})", value_type(t), text);
}

// int32_t and int64_t are the prelude's int and long long, so plain and ll literals have the
// right types.
std::string int_literal(int64_t v, Type t) {
  switch (t) {
    case Type::I1: return v & 1 ? "true" : "false";
    case Type::U8: return fmt::format("((uint8_t){}u)", uint8_t(v));
    case Type::I32: {
      const int32_t x = int32_t(uint32_t(uint64_t(v)));  // LLVM truncates constants to the type
      if (x == INT32_MIN) return "(-2147483647 - 1)";
      return x < 0 ? fmt::format("({})", x) : fmt::format("{}", x);
    }
    case Type::I64:
      if (v == INT64_MIN) return "(-9223372036854775807ll - 1)";
      return v < 0 ? fmt::format("({}ll)", v) : fmt::format("{}ll", v);
    default: throw InternalError("cuda renderer: integer constant of a float type");
  }
}

// Shortest text that reads back as the same value; non-finite values by their bits.
std::string float_literal(double v, Type t) {
  if (t == Type::F64) {
    if (!std::isfinite(v)) return fmt::format("__longlong_as_double(0x{:016x}ll)", std::bit_cast<uint64_t>(v));
    std::string s = fmt::format("{}", v);
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return "(" + s + ")";
  }
  const float f = float(v);  // rounded to nearest, as LLVM's ConstantFP::get does
  if (!std::isfinite(f)) return fmt::format("__uint_as_float(0x{:08x}u)", std::bit_cast<uint32_t>(f));
  std::string s = fmt::format("{}", f);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return "(" + s + "f)";
}

std::string math_function(const char* name, Type t) { return t == Type::F32 ? std::string(name) + "f" : name; }

class KernelRenderer {
 public:
  KernelRenderer(const Kernel& kernel, const std::string& name) : k_(kernel), name_(name) {}

  std::string render() {
    indent_ = 1;
    stmt(k_.body);
    std::string comment = fmt::format("{}{}{}", k_.name, k_.name.empty() || k_.fused_ops.empty() ? "" : ": ",
                                      fmt::join(k_.fused_ops, ", "));
    for (char& c : comment)
      if (c == '\n' || c == '\r') c = ' ';
    std::string out = "// " + comment + "\n";
    // One by-value argument (the launch copies it into the kernel's parameter space): no
    // device-side tables to write before each launch, and a CUDA graph captures it whole.
    const CudaKernelAbi abi = cuda_kernel_abi(k_);
    out += fmt::format("struct {0}_args {{ void* buffers[{1}]; int64_t params[{2}]; int64_t begin, end; }};\n", name_,
                       abi.buffer_words, abi.param_words);
    out += fmt::format("extern \"C\" __global__ void {0}(const {0}_args args) {{\n", name_);
    out += "  void* const* buffers = args.buffers;\n  const int64_t* params = args.params;\n";
    out += "  const int64_t begin = args.begin, end = args.end;\n";
    // Every buffer as a restrict pointer, const where the kernel never stores (read-only cache):
    // kernels never read a buffer through two slots (the CPU renderer's noalias), but for an
    // output a run may write over an input, and that input (Buffer::may_alias): plain pointers.
    for (int b : used_buffers_) {
      const bool written = written_buffers_.count(b) > 0;
      const std::string type = storage_type(k_.buffers[size_t(b)].type);
      const char* restrict = k_.buffers[size_t(b)].may_alias ? "" : " __restrict__";
      out += fmt::format("  {0}{1}*{3} b{2} = ({0}{1}*)buffers[{2}];\n", written ? "" : "const ", type, b, restrict);
    }
    for (int p : used_params_) out += fmt::format("  const int64_t p{0} = params[{0}];\n", p);
    if (uses_lanes_) out += "  const int64_t tsr_lane = threadIdx.x & 31;\n";
    for (const auto& [v, type] : var_types_) out += fmt::format("  {} v{};\n", value_type(type), v);
    for (int v : used_vars_)
      if (!var_types_.count(v)) throw InternalError(fmt::format("kernel IR: use of undeclared variable v{}", v));
    out += body_;
    out += "}\n";
    return out;
  }

 private:
  void line(const std::string& text) { body_ += std::string(size_t(indent_) * 2, ' ') + text + "\n"; }

  void declare_var(int v, Type type) {
    auto [it, inserted] = var_types_.emplace(v, type);
    if (!inserted && it->second != type)
      throw InternalError(fmt::format("kernel IR: v{} declared as {} and {}", v, type_name(it->second), type_name(type)));
  }

  // An operand: a leaf's text, or the temporary holding the value (computed once per statement).
  std::string expr(const Expr& e) {
    switch (e->op) {
      case Op::IntConst: return int_literal(e->iconst, e->type);
      case Op::FloatConst: return float_literal(e->fconst, e->type);
      case Op::Var: used_vars_.insert(e->id); return fmt::format("v{}", e->id);
      case Op::Param: used_params_.insert(e->id); return fmt::format("p{}", e->id);
      default: break;
    }
    if (auto it = cse_.find(e.get()); it != cse_.end()) return it->second;
    const std::string value = expr_uncached(e);
    const std::string name = fmt::format("t{}", temporaries_++);
    line(fmt::format("const {} {} = {};", value_type(e->type), name, value));
    cse_[e.get()] = name;
    return name;
  }

  std::string cast(const std::string& a, Type from, Type to) {
    if (from == to) return a;
    if (to == Type::I1) return fmt::format("{} != 0", a);  // a NaN is true, as LLVM's fcmp une
    // C conversions are LLVM's: fptosi/fptoui truncate, sitofp/uitofp follow the source's
    // signedness, integers sign- or zero-extend by the source type, f64 -> f32 rounds to nearest.
    return fmt::format("({}){}", value_type(to), a);
  }

  std::string expr_uncached(const Expr& e) {
    const Type t = e->type;
    const bool fl = is_float(t);
    std::vector<std::string> a;
    for (const auto& arg : e->args) a.push_back(expr(arg));
    const std::string u = unsigned_type(t);
    switch (e->op) {
      case Op::Load: {
        used_buffers_.insert(e->id);
        const std::string element = fmt::format("b{}[{}]", e->id, a[0]);
        switch (k_.buffers[size_t(e->id)].type) {
          case Type::BF16: return "tsr_bf16_to_f32(" + element + ")";
          case Type::F16: return "tsr_f16_to_f32(" + element + ")";
          case Type::I1: return element + " != 0";
          default: return element;
        }
      }
      case Op::Neg: return fl ? "-" + a[0] : narrow(t, fmt::format("0u - ({}){}", u, a[0]));
      case Op::Abs:
        if (fl) return math_function("fabs", t) + "(" + a[0] + ")";
        if (t == Type::U8 || t == Type::I1) return a[0];
        return fmt::format("{0} < 0 ? {1} : {0}", a[0], narrow(t, fmt::format("0u - ({}){}", u, a[0])));  // abs(MIN) = MIN
      case Op::Exp: return math_function("exp", t) + "(" + a[0] + ")";
      case Op::Log: return math_function("log", t) + "(" + a[0] + ")";
      case Op::Sqrt: return math_function("sqrt", t) + "(" + a[0] + ")";
      case Op::Tanh: return math_function("tanh", t) + "(" + a[0] + ")";
      case Op::Cos: return math_function("cos", t) + "(" + a[0] + ")";
      case Op::Sin: return math_function("sin", t) + "(" + a[0] + ")";
      case Op::Floor: return math_function("floor", t) + "(" + a[0] + ")";
      case Op::Bitcast: {
        const Type from = e->args[0]->type;
        if (from == Type::F32 && t == Type::I32) return "__float_as_int(" + a[0] + ")";
        if (from == Type::I32 && t == Type::F32) return "__int_as_float(" + a[0] + ")";
        if (from == Type::F64 && t == Type::I64) return "__double_as_longlong(" + a[0] + ")";
        if (from == Type::I64 && t == Type::F64) return "__longlong_as_double(" + a[0] + ")";
        throw InternalError(fmt::format("cuda renderer: bitcast of {} to {}", type_name(from), type_name(t)));
      }
      case Op::Shl: return narrow(t, fmt::format("({}){} << {}", u, a[0], a[1]));
      case Op::AShr:  // arithmetic: u8 shifts as the signed byte, as LLVM's ashr i8 does
        return t == Type::U8 ? fmt::format("(uint8_t)((int8_t){} >> {})", a[0], a[1]) : fmt::format("{} >> {}", a[0], a[1]);
      case Op::BitAnd: return narrow(t, a[0] + " & " + a[1]);
      case Op::BitOr: return narrow(t, a[0] + " | " + a[1]);
      case Op::BitXor: return narrow(t, a[0] + " ^ " + a[1]);
      case Op::Add: return fl ? a[0] + " + " + a[1] : narrow(t, fmt::format("({0}){1} + ({0}){2}", u, a[0], a[1]));
      case Op::Sub: return fl ? a[0] + " - " + a[1] : narrow(t, fmt::format("({0}){1} - ({0}){2}", u, a[0], a[1]));
      case Op::Mul: return fl ? a[0] + " * " + a[1] : narrow(t, fmt::format("({0}){1} * ({0}){2}", u, a[0], a[1]));
      // The halves as the hardware makes them: from a plain 64-bit multiply of zero-extended
      // words, NVVM would widen the xors feeding it to 64 bits too (Philox: a fifth more
      // instructions for sm_90).
      case Op::MulWide:
        return fmt::format("(int64_t)(((uint64_t)__umulhi((uint32_t){0}, (uint32_t){1}) << 32) | ((uint32_t){0} * (uint32_t){1}))",
                           a[0], a[1]);
      case Op::Div: return fl ? a[0] + " / " + a[1] : fmt::format("tsr_div({}, {})", a[0], a[1]);
      case Op::Rem:
        if (fl) throw InternalError("cuda renderer: rem of floats");
        return fmt::format("tsr_rem({}, {})", a[0], a[1]);
      case Op::Max: return fl ? fmt::format("tsr_maximum({}, {})", a[0], a[1]) : fmt::format("{0} > {1} ? {0} : {1}", a[0], a[1]);
      case Op::Min: return fl ? fmt::format("tsr_minimum({}, {})", a[0], a[1]) : fmt::format("{0} < {1} ? {0} : {1}", a[0], a[1]);
      case Op::Pow: return fmt::format("{}({}, {})", math_function("pow", t), a[0], a[1]);
      // C's comparisons are LLVM's: ordered ==, <, <= (false on NaN) and unordered != (true).
      case Op::Eq: return a[0] + " == " + a[1];
      case Op::Ne: return a[0] + " != " + a[1];
      case Op::Lt: return a[0] + " < " + a[1];
      case Op::Le: return a[0] + " <= " + a[1];
      case Op::And: return a[0] + " && " + a[1];
      case Op::Or: return a[0] + " || " + a[1];
      case Op::Select: return fmt::format("{} ? {} : {}", a[0], a[1], a[2]);
      case Op::Cast: return cast(a[0], e->args[0]->type, t);
      default: break;
    }
    throw InternalError("cuda renderer: bad op");
  }

  void stmt(const StmtPtr& s) {
    new_statement();
    switch (s->kind) {
      case Stmt::Kind::Block:
        for (const auto& child : s->body) stmt(child);
        return;
      case Stmt::Kind::Store: {
        used_buffers_.insert(s->buffer);
        written_buffers_.insert(s->buffer);
        const Type storage = k_.buffers[size_t(s->buffer)].type;
        std::string v = expr(s->b);
        const std::string index = expr(s->a);
        if (storage == Type::BF16) v = "tsr_bf16_bits(" + v + ")";  // rounded by lowering (kernel_ir.hpp, Store)
        else if (storage == Type::F16) v = "tsr_f16_bits(" + v + ")";
        else v = cast(v, s->b->type, compute_type(storage));
        line(fmt::format("b{}[{}] = {};", s->buffer, index, v));
        return;
      }
      case Stmt::Kind::Declare:
        declare_var(s->var, s->type);
        line(fmt::format("v{} = {};", s->var, expr(s->a)));
        return;
      case Stmt::Kind::Assign:
        line(fmt::format("v{} = {};", s->var, expr(s->a)));
        return;
      case Stmt::Kind::For: {
        declare_var(s->var, Type::I64);
        const std::string v = fmt::format("v{}", s->var);
        bool closes_guard = false;
        if (s->loop == LoopKind::Parallel)
          throw InternalError("cuda renderer: a CPU range loop; render for_target(kernel, LoopTarget::Cuda)");
        if (s->loop == LoopKind::GpuThread) {
          // Independent iterations: each thread of the grid takes every (grid size)-th one.
          line(fmt::format("for ({0} = begin + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; {0} < end; "
                           "{0} += (int64_t)gridDim.x * blockDim.x) {{",
                           v));
        } else if (s->loop == LoopKind::GpuWarp) {
          // Each warp of the grid takes every (warps in the grid)-th iteration; its lanes run the
          // body together, so the iteration's bounds are uniform across the warp.
          uses_lanes_ = true;
          line(fmt::format("for ({0} = begin + ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; {0} < end; "
                           "{0} += (int64_t)gridDim.x * blockDim.x / 32) {{",
                           v));
        } else if (s->loop == LoopKind::GpuBlock) {
          // Each block of the grid takes every (blocks in the grid)-th iteration; its threads run
          // the body together, so the iteration's bounds are uniform across the block (its
          // combines reach __syncthreads in every thread).
          block_lanes_ = true;
          line(fmt::format("for ({0} = begin + (int64_t)blockIdx.x; {0} < end; {0} += (int64_t)gridDim.x) {{", v));
        } else if (s->loop == LoopKind::Lanes) {
          // Lane l takes iterations l, l + lanes, ...; the combine after the loop joins them.
          const std::string lo = expr(s->a), hi = expr(s->b);
          if (block_lanes_)
            line(fmt::format("for ({0} = {1} + (int64_t)threadIdx.x; {0} < {2}; {0} += (int64_t)blockDim.x) {{", v, lo, hi));
          else
            line(fmt::format("for ({0} = {1} + tsr_lane; {0} < {2}; {0} += 32) {{", v, lo, hi));
        } else if (s->loop == LoopKind::Ordered) {
          // Iterations that depend on each other (a column reduction accumulating into its
          // output): one thread runs them in order.
          line("if (blockIdx.x == 0 && threadIdx.x == 0) {");
          ++indent_;
          closes_guard = true;
          line(fmt::format("for ({0} = begin; {0} < end; ++{0}) {{", v));
        } else {
          // Other inner loops run serially in each thread.
          const std::string lo = expr(s->a), hi = expr(s->b);
          line(fmt::format("for ({0} = {1}; {0} < {2}; ++{0}) {{", v, lo, hi));
        }
        ++indent_;
        for (const auto& child : s->body) stmt(child);
        --indent_;
        line("}");
        if (closes_guard) {
          --indent_;
          line("}");
        }
        new_statement();
        if (s->loop == LoopKind::Lanes) combine_lanes(*s);
        return;
      }
    }
  }

  // After a lanes loop: a butterfly over the warp's lanes. Each step combines two values in
  // either order (commutative), so every lane ends with bitwise the same result. In a block, the
  // warps' results then meet in shared memory and every thread combines them in warp order.
  void combine_lanes(const Stmt& s) {
    const auto type = var_types_.find(s.reduce_var);
    if (type == var_types_.end()) throw InternalError(fmt::format("cuda renderer: lanes combine undeclared v{}", s.reduce_var));
    if (s.lanes_in_order) return fold_lanes_in_order(s, type->second);
    const std::string acc = fmt::format("v{}", s.reduce_var), other = "__shfl_xor_sync(0xffffffffu, " + acc + ", tsr_o)";
    const bool fl = is_float(type->second);
    std::string combined;
    switch (s.reduce_op) {
      case Op::Add: combined = acc + " + " + other; break;
      case Op::Mul: combined = acc + " * " + other; break;
      case Op::Max: combined = fl ? fmt::format("tsr_maximum({}, {})", acc, other) : fmt::format("max({}, {})", acc, other); break;
      case Op::Min: combined = fl ? fmt::format("tsr_minimum({}, {})", acc, other) : fmt::format("min({}, {})", acc, other); break;
      default: throw InternalError("cuda renderer: lanes combine with a non-reducing op");
    }
    line(fmt::format("for (int tsr_o = 16; tsr_o > 0; tsr_o >>= 1) {} = {};", acc, combined));
    used_vars_.insert(s.reduce_var);
    if (block_lanes_) combine_warps(acc, type->second, combined);
  }

  // In lane order: every lane folds lane 0's value, then lane 1's, ... (the loop gave each
  // lane at most one iteration, in order), so the sum is one thread's running sum over the
  // iterations. A lane without one holds the identity, which changes no running sum (a sum
  // from +0 is never -0).
  void fold_lanes_in_order(const Stmt& s, Type type) {
    if (s.reduce_op != Op::Add) throw InternalError("cuda renderer: in-order lanes combine other than by Add");
    const std::string acc = fmt::format("v{}", s.reduce_var);
    line("{");
    ++indent_;
    line(fmt::format("{} tsr_f = __shfl_sync(0xffffffffu, {}, 0);", value_type(type), acc));
    line(fmt::format("for (int tsr_l = 1; tsr_l < 32; ++tsr_l) tsr_f = tsr_f + __shfl_sync(0xffffffffu, {}, tsr_l);", acc));
    line(fmt::format("{} = tsr_f;", acc));
    --indent_;
    line("}");
    used_vars_.insert(s.reduce_var);
  }

  // The block's warps' results (each already the same in its lanes): lane 0 of each publishes
  // its warp's, then every thread combines them in warp order. `combined` is the butterfly's
  // expression, its shuffle replaced here by a warp's published value. The second barrier
  // keeps the slots until every thread has read them (the range loop's next iteration reuses
  // them).
  void combine_warps(const std::string& acc, Type type, std::string combined) {
    const std::string slots = fmt::format("tsr_warps{}", block_combines_++);
    const std::string shuffle = "__shfl_xor_sync(0xffffffffu, " + acc + ", tsr_o)";
    combined.replace(combined.find(shuffle), shuffle.size(), slots + "[tsr_w]");
    line("{");
    ++indent_;
    line(fmt::format("__shared__ {} {}[32];", value_type(type), slots));
    line(fmt::format("if ((threadIdx.x & 31) == 0) {}[threadIdx.x >> 5] = {};", slots, acc));
    line("__syncthreads();");
    line(fmt::format("{} = {}[0];", acc, slots));
    line(fmt::format("for (int tsr_w = 1; tsr_w < (int)(blockDim.x >> 5); ++tsr_w) {} = {};", acc, combined));
    line("__syncthreads();");
    --indent_;
    line("}");
  }

  // Values are reused only within a statement: variables change between statements, and a
  // temporary declared inside a loop body is out of scope after it.
  void new_statement() { cse_.clear(); }

  const Kernel& k_;
  const std::string name_;
  std::string body_;
  int indent_ = 1;
  int temporaries_ = 0;
  std::map<const ExprNode*, std::string> cse_;
  std::set<int> used_buffers_, written_buffers_, used_params_, used_vars_;
  bool uses_lanes_ = false;  // a gpu_warp range loop: lanes loops need the lane index
  bool block_lanes_ = false;  // a gpu_block range loop: lanes loops split over the block's threads
  int block_combines_ = 0;    // shared-memory slots declared so far (one array per combine)
  std::map<int, Type> var_types_;
};

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

}  // namespace

namespace {

// Each shared subexpression visited once: expressions are DAGs (Philox's rounds reuse their
// words), which a plain recursion would walk as trees.
int max_param_slot(const Expr& e, std::set<const ExprNode*>& seen) {
  if (!seen.insert(e.get()).second) return -1;
  int slot = e->op == Op::Param ? e->id : -1;
  for (const Expr& a : e->args) slot = std::max(slot, max_param_slot(a, seen));
  return slot;
}

int max_param_slot(const StmtPtr& s, std::set<const ExprNode*>& seen) {
  int slot = -1;
  if (s->a) slot = std::max(slot, max_param_slot(s->a, seen));
  if (s->b) slot = std::max(slot, max_param_slot(s->b, seen));
  for (const StmtPtr& child : s->body) slot = std::max(slot, max_param_slot(child, seen));
  return slot;
}

}  // namespace

CudaKernelAbi cuda_kernel_abi(const kir::Kernel& kernel) {
  // At least one word of each: C++ has no zero-length arrays.
  std::set<const ExprNode*> seen;
  int slot = max_param_slot(kernel.body, seen);
  if (kernel.outer_extent) slot = std::max(slot, max_param_slot(kernel.outer_extent, seen));
  return CudaKernelAbi{std::max<int64_t>(1, int64_t(kernel.buffers.size())), std::max<int64_t>(1, slot + 1)};
}

std::string render_cuda(const std::vector<kir::Kernel>& kernels, const std::vector<std::string>& names) {
  if (kernels.size() != names.size()) throw InternalError("render_cuda: one name per kernel");
  std::string out(cuda_prelude());
  for (size_t i = 0; i < kernels.size(); ++i) {
    if (!is_identifier(names[i])) throw InternalError("render_cuda: kernel name '" + names[i] + "' is not a C identifier");
    out += "\n" + KernelRenderer(kernels[i], names[i]).render();
  }
  return out;
}

}  // namespace tessera
