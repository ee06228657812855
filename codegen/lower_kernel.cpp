#include "codegen/lower_kernel.hpp"

#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>
#include <map>

#include "codegen/index_arithmetic.hpp"
#include "codegen/math_functions.hpp"
#include "codegen/loop_capabilities.hpp"
#include "codegen/philox.hpp"
#include "codegen/reduction_strategy.hpp"
#include "codegen/shared_values.hpp"
#include "codegen/split_loops.hpp"
#include "codegen/storage_rounding.hpp"
#include "dsl/dot_form.hpp"
#include "dsl/element_count.hpp"
#include "dsl/error.hpp"
#include "dsl/special_function.hpp"

namespace tessera {
namespace {

using namespace kir;

// Raised deep inside lowering where an inlined value cannot be; lower_group returns it as a
// FusionRefusal.
struct Refused {
  FusionRefusal refusal;
};

using Index = ElementIndex;

Expr identity(ReduceOp op, Type t) {
  const bool f = is_float(t);
  switch (op) {
    case ReduceOp::Sum: case ReduceOp::Avg: return f ? float_const(0, t) : int_const(0, t);
    case ReduceOp::Product: return f ? float_const(1, t) : int_const(1, t);
    case ReduceOp::Max:
      if (f) return float_const(-std::numeric_limits<double>::infinity(), t);
      return int_const(t == Type::I32 ? std::numeric_limits<int32_t>::min() : t == Type::U8 ? 0 : std::numeric_limits<int64_t>::min(), t);
    case ReduceOp::Min:
      if (f) return float_const(std::numeric_limits<double>::infinity(), t);
      return int_const(t == Type::I32 ? std::numeric_limits<int32_t>::max() : t == Type::U8 ? 255 : std::numeric_limits<int64_t>::max(), t);
  }
  throw InternalError("identity: bad op");
}

// The kernel IR op that combines two partial results of `op` (an average sums).
Op combining_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: case ReduceOp::Avg: return Op::Add;
    case ReduceOp::Product: return Op::Mul;
    case ReduceOp::Max: return Op::Max;
    case ReduceOp::Min: return Op::Min;
  }
  throw InternalError("combining_op: bad op");
}

Expr combine(ReduceOp op, Expr acc, Expr v) { return binary(combining_op(op), acc, v); }

class Lowerer {
 public:
  Lowerer(const LocalProgram& p, const std::vector<int>& roots, const std::vector<bool>& mat, std::vector<int>& buffer_nodes,
          LoopTarget target)
      : p_(p), index_(p), root_(roots.front()), roots_(roots), mat_(mat), buffer_nodes_(buffer_nodes), target_(target),
        capabilities_(loop_capabilities(target)) {
    buffer_nodes_.clear();
    for (int r : roots) {  // buffers 0..k-1: the outputs
      buffer_nodes_.push_back(r);
      kernel_.buffers.push_back({type_of(node(r).dtype), true});
    }
  }

  Kernel lower() {
    kernel_.ordered_reductions = p_.target.deterministic;
    const LocalNode& r = node(root_);
    if (r.op == OpKind::Dot) lower_dot();
    else if (r.op == OpKind::ScatterAddRows) lower_scatter_add_rows();
    else if (r.op == OpKind::CheckIndex) lower_check_index();
    else if (is_reduce(r.op)) lower_reduce_root();
    else lower_elementwise_root();
    kernel_.num_vars = next_var_;
    split_loops_at_divisors(kernel_);
    bind_shared_values(kernel_);
    // The range loop as the target runs it (a GPU's grid-stride threads). Unverified here: the
    // schedule verifies each distinct kernel once (KernelTable in codegen/schedule.cpp).
    if (target_ != LoopTarget::Cpu) return retargeted(std::move(kernel_), target_);
    return std::move(kernel_);
  }

 private:
  const LocalNode& node(int id) const { return p_.nodes[id]; }
  Type storage(int id) const { return type_of(node(id).dtype); }
  Type ctype(int id) const { return compute_type(storage(id)); }
  // A store into the root of a value computed in f32 and never rounded (an accumulator),
  // rounded to a bf16/f16 root's type first as a Store requires (kernel_ir.hpp). value()'s
  // results are rounded already, and reductions' identities are exact in every type.
  StmtPtr store_rounded(Expr index, Expr v) const {
    return store(0, std::move(index), round_to_storage(std::move(v), storage(root_)));
  }
  int new_var() { return next_var_++; }

  // Extents, offsets and positions: codegen/index_arithmetic.hpp.
  Expr dim(const SymbolicDim& d) const { return index_.dim(d); }
  Expr extent(int id, int64_t axis) const { return index_.extent(id, axis); }
  Expr offset(int id, int64_t axis) const { return index_.offset(id, axis); }
  bool extent_is_one(int id, int64_t axis) const { return index_.extent_is_one(id, axis); }
  Expr numel(int id) const { return index_.numel(id); }
  Expr linearize(int id, const std::vector<Expr>& idx) const { return index_.linearize(id, idx); }
  Expr linear(int id, const Index& idx) const { return index_.linear(id, idx); }

  int buffer(int id) {
    auto it = buffer_of_.find(id);
    if (it != buffer_of_.end()) return it->second;
    int b = int(kernel_.buffers.size());
    kernel_.buffers.push_back({storage(id), false});
    buffer_nodes_.push_back(id);
    buffer_of_[id] = b;
    return b;
  }

  // ---- values ----
  // Memoised per (value, index expressions): a value inlined into several consumers at the same
  // index becomes one shared expression (a DAG), not a copy per use.
  Expr value(int id, const Index& idx) {
    std::vector<const void*> key = {reinterpret_cast<const void*>(intptr_t(id)), idx.flat.get()};
    for (const Expr& a : idx.axes) key.push_back(a.get());
    if (auto it = values_.find(key); it != values_.end()) return it->second.value;
    Expr v = compute_value(id, idx);
    values_.emplace(std::move(key), MemoisedValue{idx, v});
    return v;
  }

  bool is_root(int id) const { return std::find(roots_.begin(), roots_.end(), id) != roots_.end(); }

  Expr compute_value(int id, const Index& idx) {
    if (mat_[id] && !is_root(id)) return load(buffer(id), storage(id), linear(id, idx));
    const LocalNode& n = node(id);
    if (n.kind == LocalNode::Kind::Redistribute) return local_chunk(id, idx);
    // bf16/f16 values are computed in f32 and rounded as if stored after every op, so a fused
    // chain (a cast to f16 included) gives the bits of its ops run one by one.
    if (is_movement(n.op)) return computed(id, idx);
    count_op(n, storage(id));
    return round_to_storage(computed(id, idx), storage(id));
  }

  void count_op(const LocalNode& n, Type stored) {
    if (n.op == OpKind::Full) return;  // a constant: folded
    // A reduction combines once per element it reads, as do the ops computing what it reads.
    auto& counts = reading_reduced_ > 0 || is_reduce(n.op) ? kernel_.per_reduced_element : kernel_.per_output_element;
    ++counts.ops;
    if (const auto f = special_function_of(n.op)) ++counts.special[size_t(*f)];
    counts.rounded_to_bf16 += stored == Type::BF16;
    counts.rounded_to_f16 += stored == Type::F16;
  }

  Expr computed(int id, const Index& idx) {
    const LocalNode& n = node(id);
    fused(n);
    if (is_elementwise(n.op)) return elementwise(id, idx);
    switch (n.op) {
      case OpKind::Full:
        return is_float(ctype(id)) ? float_const(n.attrs.scalar, ctype(id)) : int_const(int64_t(n.attrs.scalar), ctype(id));
      case OpKind::Iota: {
        int64_t a = n.attrs.axes[0];
        return cast(binary(Op::Add, idx.axes[a], offset(id, a)), ctype(id));
      }
      case OpKind::RandomUniform: case OpKind::RandomNormal:
        return random(id, idx);
      case OpKind::ReduceSum: case OpKind::ReduceProd: case OpKind::ReduceMax: case OpKind::ReduceMin:
        return hoisted_reduce(id, idx);
      case OpKind::TakeRows:
        return take_rows(id, idx);
      default:
        if (is_movement(n.op)) return movement(id, idx);
        throw Refused{FusionRefusal{id, std::string(op_name(n.op)) + " cannot be computed inline"}};
    }
  }

  // Records a compute op for explain(); movement and constants are index arithmetic, not work.
  void fused(const LocalNode& n) {
    if (is_movement(n.op) || n.op == OpKind::Full) return;
    std::string name(op_name(n.op));
    if (kernel_.fused_ops.empty() || kernel_.fused_ops.back() != name) kernel_.fused_ops.push_back(name);
  }

  Expr as_bool(Expr v) {
    if (v->type == Type::I1) return v;
    return binary(Op::Ne, v, is_float(v->type) ? float_const(0, v->type) : int_const(0, v->type));
  }

  // Transcendentals: f32 through the polynomial versions (vectorisable, layout-independent).
  static Expr math(Op op, Expr a) {
    if (a->type == Type::F32) {
      switch (op) {
        case Op::Exp: return exp_f32(a);
        case Op::Log: return log_f32(a);
        case Op::Cos: return cos_f32(a);
        case Op::Sin: return sin_f32(a);
        case Op::Tanh: return tanh_f32(a);
        default: break;
      }
    }
    return unary(op, a);
  }

  Expr convert(Expr v, Type to) {
    if (v->type == to) return v;
    if (to == Type::U8) return cast(as_bool(v), Type::U8);  // bool: any nonzero is true
    return cast(v, to);
  }

  Expr elementwise(int id, const Index& idx) {
    const LocalNode& n = node(id);
    std::vector<Expr> a;
    for (int in : n.inputs) a.push_back(value(in, idx));
    const Type t = ctype(id);
    switch (n.op) {
      case OpKind::Neg: return unary(Op::Neg, a[0]);
      case OpKind::Abs: return unary(Op::Abs, a[0]);
      case OpKind::Exp: return math(Op::Exp, a[0]);
      case OpKind::Log: return math(Op::Log, a[0]);
      case OpKind::Sqrt: return unary(Op::Sqrt, a[0]);
      case OpKind::Tanh: return math(Op::Tanh, a[0]);
      case OpKind::Sin: return math(Op::Sin, a[0]);
      case OpKind::Cos: return math(Op::Cos, a[0]);
      case OpKind::Add: return binary(Op::Add, a[0], a[1]);
      case OpKind::Sub: return binary(Op::Sub, a[0], a[1]);
      case OpKind::Mul: return binary(Op::Mul, a[0], a[1]);
      case OpKind::Maximum: return binary(Op::Max, a[0], a[1]);
      case OpKind::Minimum: return binary(Op::Min, a[0], a[1]);
      case OpKind::Div: {
        if (is_float(t)) return binary(Op::Div, a[0], a[1]);
        // Integer division truncates and never traps: x / 0 gives 0 (numpy's result), and x / -1
        // is -x, which wraps for the most negative value as numpy's does (the CPU's divide traps).
        Expr zero = int_const(0, t), is_zero = binary(Op::Eq, a[1], zero);
        if (t == Type::U8) return select(is_zero, zero, binary(Op::Div, a[0], select(is_zero, int_const(1, t), a[1])));
        Expr is_minus_one = binary(Op::Eq, a[1], int_const(-1, t));
        Expr safe = select(binary(Op::Or, is_zero, is_minus_one), int_const(1, t), a[1]);
        return select(is_zero, zero, select(is_minus_one, binary(Op::Sub, zero, a[0]), binary(Op::Div, a[0], safe)));
      }
      case OpKind::Pow:
        if (is_float(t)) return binary(Op::Pow, a[0], a[1]);
        return cast(binary(Op::Pow, cast(a[0], Type::F64), cast(a[1], Type::F64)), t);
      case OpKind::Equal: return cast(binary(Op::Eq, a[0], a[1]), Type::U8);
      case OpKind::NotEqual: return cast(binary(Op::Ne, a[0], a[1]), Type::U8);
      case OpKind::Less: return cast(binary(Op::Lt, a[0], a[1]), Type::U8);
      case OpKind::LessEqual: return cast(binary(Op::Le, a[0], a[1]), Type::U8);
      case OpKind::Where: return select(as_bool(a[0]), a[1], a[2]);
      case OpKind::Cast: return convert(a[0], t);
      case OpKind::StopGradient: case OpKind::ReducePartials: return a[0];
      default: throw InternalError("elementwise: unexpected op " + std::string(op_name(n.op)));
    }
  }

  // An op that only moves data reads its input at the element index_arithmetic names.
  Expr movement(int id, const Index& idx) {
    const LocalNode& n = node(id);
    const int in = n.inputs.empty() ? -1 : n.inputs[0];
    if (idx.flat) return value(in, idx);  // flat kernels only move constants, which ignore the index
    switch (n.op) {
      case OpKind::Permute: return value(in, index_.permuted_source(id, idx));
      case OpKind::Expand: return value(in, index_.broadcast_source(id, idx));
      case OpKind::Reshape: return value(in, index_.reshaped_source(id, idx));
      case OpKind::Slice: return value(in, index_.sliced_source(id, idx));
      case OpKind::Pad: {
        const IndexArithmetic::Padded padded = index_.padded_source(id, idx);
        Type t = ctype(id);
        Expr fill = is_float(t) ? float_const(n.attrs.scalar, t) : int_const(int64_t(n.attrs.scalar), t);
        return select(padded.inside, value(in, padded.source), fill);
      }
      case OpKind::Concat: {
        const std::vector<std::pair<Expr, Index>> sources = index_.concatenated_sources(id, idx);
        std::vector<Expr> values;
        for (size_t k = 0; k < sources.size(); ++k) values.push_back(value(n.inputs[k], sources[k].second));
        Expr result = values.back();
        for (int64_t k = int64_t(sources.size()) - 2; k >= 0; --k) result = select(sources[size_t(k)].first, values[size_t(k)], result);
        return result;
      }
      default: throw InternalError("movement: unexpected op");
    }
  }

  // A local chunk (Replicate -> Shard, no communication) read in place.
  Expr local_chunk(int id, const Index& idx) {
    const LocalNode& n = node(id);
    if (n.step.kind != RedistributeKind::LocalChunk) throw Refused{FusionRefusal{id, "a collective's result is not computed inline"}};
    if (idx.flat) throw Refused{FusionRefusal{id, "a local chunk needs per-axis indices"}};
    return value(n.inputs[0], index_.chunk_source(id, idx));
  }

  // Row ids[n] of this device's block of a [V, D] table (global ids, the block at `offset`):
  // where inside it, the row (`inside` true), else a clamped row the caller discards.
  struct LocalRow {
    Expr row, inside;
  };
  // The local row of `rows_of` that the id at `at` (one index per axis of ids) names.
  LocalRow local_row(int ids, std::vector<Expr> at, int rows_of) {
    Expr row = binary(Op::Sub, cast(value(ids, Index{std::move(at), nullptr}), Type::I64), offset(rows_of, 0));
    Expr ext = extent(rows_of, 0);
    Expr inside = binary(Op::And, binary(Op::Le, int_const(0), row), binary(Op::Lt, row, ext));
    return {binary(Op::Max, int_const(0), binary(Op::Min, row, binary(Op::Sub, ext, int_const(1)))), inside};
  }

  // take_rows: an indexed load; ids this device's block does not hold give zero (the vocabulary
  // shards' partial sums then add up to the row).
  Expr take_rows(int id, const Index& idx) {
    if (idx.flat) throw Refused{FusionRefusal{id, "take_rows needs per-axis indices"}};
    const int table = node(id).inputs[0], ids = node(id).inputs[1];
    const LocalRow r = local_row(ids, std::vector<Expr>(idx.axes.begin(), idx.axes.end() - 1), table);
    return select(r.inside, value(table, Index{{r.row, idx.axes.back()}, nullptr}), identity(ReduceOp::Sum, ctype(id)));
  }

  // Counter-based random numbers on the GLOBAL element index (layout-invariant).
  Expr random(int id, const Index& idx) {
    const LocalNode& n = node(id);
    Expr counter = int_const(0);
    int64_t stride = 1;
    for (int64_t a = n.rank() - 1; a >= 0; --a) {
      counter = binary(Op::Add, counter, binary(Op::Mul, binary(Op::Add, idx.axes[a], offset(id, a)), int_const(stride)));
      stride *= n.global_shape[a];
    }
    const Type t = ctype(id);
    // The seed is a parameter: initialisers of one shape in every layer share a kernel.
    const std::array<Expr, 4> words = n.seed_param >= 0 ? philox(counter, param(n.seed_param)) : philox(counter, n.attrs.seed);
    // 24 (f32) or 53 (f64) random bits -> [0, 1)
    auto unit = [&](int word_lo, int word_hi, bool open_at_zero) {
      Expr v;
      if (t == Type::F64) {
        Expr bits = binary(Op::Add, binary(Op::Mul, binary(Op::Div, words[size_t(word_hi)], int_const(1 << 11)),
                                          int_const(int64_t(1) << 32)),
                           words[size_t(word_lo)]);
        if (open_at_zero) bits = binary(Op::Add, bits, int_const(1));
        v = binary(Op::Mul, cast(bits, Type::F64), float_const(std::ldexp(1.0, -53), Type::F64));
      } else {
        Expr bits = binary(Op::Div, words[size_t(word_lo)], int_const(256));
        if (open_at_zero) bits = binary(Op::Add, bits, int_const(1));
        v = binary(Op::Mul, cast(bits, Type::F32), float_const(std::ldexp(1.0, -24), Type::F32));
      }
      return v;
    };
    if (n.op == OpKind::RandomUniform) {
      Expr u = unit(0, 1, false);
      return binary(Op::Add, float_const(n.attrs.scalar, t), binary(Op::Mul, float_const(n.attrs.scalar2 - n.attrs.scalar, t), u));
    }
    // Box-Muller: sqrt(-2 ln u1) cos(2 pi u2), u1 in (0, 1].
    Expr u1 = unit(0, 1, true), u2 = unit(2, 3, false);
    Expr radius = unary(Op::Sqrt, binary(Op::Mul, float_const(-2.0, t), math(Op::Log, u1)));
    Expr angle = binary(Op::Mul, float_const(2 * M_PI, t), u2);
    Expr z = binary(Op::Mul, radius, t == Type::F32 ? cos_f32_within_two_pi(angle) : unary(Op::Cos, angle));
    return binary(Op::Add, float_const(n.attrs.scalar, t), binary(Op::Mul, float_const(n.attrs.scalar2, t), z));
  }

  // ---- reductions ----

  // Reduction loops over the reduced axes of `id`'s input, combining into a fresh accumulator.
  // `outer` gives the index of the non-reduced input axes (in order). Returns the statements.
  // `cascade`: long float sums add in blocked partial sums (blocked_sum); false keeps one running
  // sum in the loops' order (a column reduction's own order, see column_by_output).
  // `cascade_outermost` false: the outermost reduced loop adds plainly (its iterations are a
  // block's threads' shares, each thread's own running sum), the inner ones still in a cascade.
  // `merged`: the leading reduced loops run as one flat loop (ReductionStrategy::merged_loops),
  // each axis's index its quotient and remainder.
  std::vector<StmtPtr> reduce_loops(int id, const std::vector<Expr>& outer, int acc, ReduceOp op, bool cascade = true,
                                    bool cascade_outermost = true, int merged = 1) {
    const LocalNode& n = node(id);
    const int in = n.inputs[0];
    struct Loop {
      int var;
      Expr extent;
      int64_t global_extent;
    };
    std::vector<Loop> loops;
    std::vector<int64_t> reduced;  // the input's reduced axes, outermost first
    for (int64_t a = 0; a < node(in).rank(); ++a)
      if (std::find(n.attrs.axes.begin(), n.attrs.axes.end(), a) != n.attrs.axes.end()) reduced.push_back(a);
    merged = std::clamp(merged, 1, std::max(1, int(reduced.size())));
    std::map<int64_t, Expr> index_of;  // reduced axis -> its index
    if (!reduced.empty()) {
      // The first `merged` axes: one loop over the product of their extents.
      const int flat = new_var();
      Expr extent_product = int_const(1);
      int64_t global_product = 1;
      for (int k = 0; k < merged; ++k) {
        extent_product = k == 0 ? extent(in, reduced[0]) : binary(Op::Mul, extent_product, extent(in, reduced[size_t(k)]));
        global_product *= node(in).global_shape[size_t(reduced[size_t(k)])];
      }
      Expr rest = var(flat);
      for (int k = merged - 1; k >= 0; --k) {
        const int64_t axis = reduced[size_t(k)];
        index_of[axis] = k == 0 ? rest : binary(Op::Rem, rest, extent(in, axis));
        if (k > 0) rest = binary(Op::Div, rest, extent(in, axis));
      }
      loops.push_back({flat, extent_product, global_product});
      for (size_t k = size_t(merged); k < reduced.size(); ++k) {
        const int v = new_var();
        loops.push_back({v, extent(in, reduced[k]), node(in).global_shape[size_t(reduced[k])]});
        index_of[reduced[k]] = var(v);
      }
    }
    Index in_idx;
    size_t k = 0;
    for (int64_t a = 0; a < node(in).rank(); ++a) in_idx.axes.push_back(index_of.count(a) ? index_of[a] : outer[k++]);
    const Type t = ctype(id);
    const bool float_sum = is_float(t) && (op == ReduceOp::Sum || op == ReduceOp::Avg);
    // Adds loops [l, end) into `into`: a long float sum through blocked partial sums.
    std::function<std::vector<StmtPtr>(size_t, int)> level = [&](size_t l, int into) -> std::vector<StmtPtr> {
      if (l == loops.size()) return {assign(into, combine(op, var(into, t), value(in, in_idx)))};
      const Loop& loop = loops[l];
      if (!float_sum || !cascade || (l == 0 && !cascade_outermost) || loop.global_extent <= kSumBlock)
        return {for_loop(loop.var, int_const(0), loop.extent, level(l + 1, into))};
      return blocked_sum(loop.var, loop.extent, loop.global_extent, into, t, [&](int partial) { return level(l + 1, partial); });
    };
    std::vector<StmtPtr> out = {declare(acc, t, identity(op, t))};
    const ReadingReduced reading(*this);
    for (StmtPtr& s : level(0, acc)) out.push_back(std::move(s));
    return out;
  }

  // A float sum over more than kSumBlock elements adds in a cascade (codegen/reduction_strategy.hpp):
  // blocks of kSumBlock elements, then groups of kSumFanIn such partial sums, level by level up
  // to the whole axis. Rounding error then grows with kSumBlock plus
  // kSumFanIn per level rather than with the element count, and a sum of 2^31 ones is exact in
  // f32 (one running f32 sum stops growing at 2^24). The order is the loops' own, so
  // deterministic kernels keep one order; the levels come from the axis's global extent.
  template <class Body>
  std::vector<StmtPtr> blocked_sum(int v, Expr n, int64_t global_extent, int into, Type t, Body body) {
    auto ceil_div = [](Expr a, int64_t b) { return binary(Op::Div, binary(Op::Add, a, int_const(b - 1)), int_const(b)); };
    // sizes[k]: elements in a block of level k (level 0: one element).
    std::vector<int64_t> sizes = {1, kSumBlock};
    while (sizes.back() * kSumFanIn < global_extent) sizes.push_back(sizes.back() * kSumFanIn);
    // Statements adding the level-k block that starts at element `first` into `acc`.
    std::function<std::vector<StmtPtr>(size_t, Expr, int)> level = [&](size_t k, Expr first, int acc) -> std::vector<StmtPtr> {
      const int64_t fan = k == 1 ? kSumBlock : kSumFanIn;
      const int64_t child = sizes[k - 1];
      if (k == 1) {
        const Expr end = binary(Op::Min, n, binary(Op::Add, first, int_const(fan)));
        return {for_loop(v, first, end, body(acc))};
      }
      const int b = new_var(), partial = new_var();
      const Expr from = binary(Op::Div, first, int_const(child));
      const Expr to = binary(Op::Min, ceil_div(n, child), binary(Op::Add, from, int_const(fan)));
      std::vector<StmtPtr> inner = {declare(partial, t, float_const(0, t))};
      for (StmtPtr& s : level(k - 1, binary(Op::Mul, var(b), int_const(child)), partial)) inner.push_back(std::move(s));
      inner.push_back(assign(acc, binary(Op::Add, var(acc, t), var(partial, t))));
      return {for_loop(b, from, to, std::move(inner))};
    };
    // The top level: every block of the largest size, each summed on its own, then added.
    const size_t top = sizes.size() - 1;
    const int b = new_var(), partial = new_var();
    std::vector<StmtPtr> inner = {declare(partial, t, float_const(0, t))};
    for (StmtPtr& s : level(top, binary(Op::Mul, var(b), int_const(sizes[top])), partial)) inner.push_back(std::move(s));
    inner.push_back(assign(into, binary(Op::Add, var(into, t), var(partial, t))));
    return {for_loop(b, int_const(0), ceil_div(n, sizes[top]), std::move(inner))};
  }

  // A reduction's facts for its strategy (codegen/reduction_strategy.hpp), from global extents
  // (every device lowers the same kernel).
  ReductionFacts reduction_facts(int id) const {
    const LocalNode& n = node(id);
    const auto& in_shape = node(n.inputs[0]).global_shape;
    ReductionFacts f;
    f.op = n.op == OpKind::ArgMax ? ReduceOp::Max : reduce_op_of(n.op);
    f.compute = ctype(id);
    f.storage = storage(id);
    for (int64_t a : n.attrs.axes) f.reduced_elements *= in_shape[size_t(a)];
    f.output_elements = element_count(n.global_shape);
    for (int64_t a = 0; a < int64_t(in_shape.size()); ++a)
      if (std::find(n.attrs.axes.begin(), n.attrs.axes.end(), a) != n.attrs.axes.end()) f.reduced_extents.push_back(in_shape[size_t(a)]);
    f.reduces_innermost_axis = reduces_innermost_axis(n);
    f.ordered = kernel_.ordered_reductions;
    f.has_preludes = has_preludes();
    return f;
  }
  // Whether work computed once per row (an inlined reduce) sits before the innermost loops.
  bool has_preludes() const {
    return std::any_of(preludes_.begin(), preludes_.end(), [](const auto& prelude) { return !prelude.empty(); });
  }

  // A row reduction (its input's innermost axis among the reduced ones) reads contiguous memory
  // in its inner loop; a column reduction does not.
  bool reduces_innermost_axis(const LocalNode& reduce) const {
    const int64_t in_rank = node(reduce.inputs[0]).rank();
    const auto& axes = reduce.attrs.axes;
    return in_rank == 0 || std::find(axes.begin(), axes.end(), in_rank - 1) != axes.end();
  }

  // An inlined reduce: computed once per iteration of the root loops its index depends on.
  Expr hoisted_reduce(int id, const Index& idx) {
    const int64_t m = node(id).rank();
    if (idx.flat || m > int64_t(root_index_.size()))
      throw Refused{FusionRefusal{id, "reduce is not indexed by the kernel's loops"}};
    for (int64_t j = 0; j < m; ++j)
      if (!equal(idx.axes[j], root_index_[j]))
        throw Refused{FusionRefusal{id, "reduce is indexed by other than a prefix of the kernel's loops"}};
    auto it = hoisted_.find(id);
    if (it != hoisted_.end()) return it->second;
    // Inlined, a column reduction reads its input one strided element at a time (a bias
    // gradient ran at ~1.5 GB/s); as its own kernel it streams the input in memory order.
    if (!reduces_innermost_axis(node(id))) throw Refused{FusionRefusal{id, "a column reduction streams its input as its own kernel"}};
    if (reduce_runs_alone(reduction_facts(id), capabilities_))
      throw Refused{FusionRefusal{id, "a long reduction runs in parallel as its own kernel on a GPU"}};
    int acc = new_var();
    auto stmts = reduce_loops(id, idx.axes, acc, reduce_op_of(node(id).op));
    auto& prelude = preludes_[m];  // inside the loop of root axis m-1 (0: before all loops)
    prelude.insert(prelude.end(), stmts.begin(), stmts.end());
    Expr v = var(acc, ctype(id));
    hoisted_[id] = v;
    return v;
  }

  // ---- roots ----

  // Loops over `id`'s local shape; extent-1 axes get the index 0 and no loop.
  std::vector<Expr> make_loops(int id, std::vector<int>& vars) {
    std::vector<Expr> idx;
    for (int64_t a = 0; a < node(id).rank(); ++a) {
      if (extent_is_one(id, a)) {
        idx.push_back(int_const(0));
        vars.push_back(-1);
      } else {
        vars.push_back(new_var());
        idx.push_back(var(vars.back()));
      }
    }
    return idx;
  }

  // Wraps `innermost` in the loops (outermost first), inserting each depth's prelude; the
  // outermost real loop becomes the kernel's range loop (of kind `range`: its iterations
  // independent). Where iterations are threads (CUDA) the leading loops down to the first
  // prelude are one flat range loop instead (flat_range_axes).
  StmtPtr nest(int id, const std::vector<int>& vars, std::vector<StmtPtr> innermost, LoopKind range = LoopKind::Parallel) {
    std::vector<StmtPtr> body = std::move(innermost);
    const int64_t r = int64_t(vars.size());
    int64_t first_loop = -1;
    for (int64_t a = 0; a < r; ++a)
      if (vars[a] >= 0) { first_loop = a; break; }
    const int64_t flat = flat_range_axes(vars);
    Expr flat_count;
    for (int64_t a = r - 1; a >= 0; --a) {
      auto& pre = preludes_[a + 1];
      body.insert(body.begin(), pre.begin(), pre.end());
      if (vars[a] < 0 || a < flat) continue;
      body = {for_loop(vars[a], int_const(0), extent(id, a), std::move(body), a == first_loop ? range : LoopKind::Serial)};
      // An inner loop over the output's axes: as independent as the range loop, where that is
      // Parallel (an Ordered one keeps its order all the way down).
      if (a != first_loop && range == LoopKind::Parallel) body.front()->independent = true;
    }
    if (flat > 0) {
      // One iteration per element of the flattened axes; each axis's index from the flat one.
      const int f = new_var();
      Expr stride = int_const(1);
      std::vector<StmtPtr> indices;
      for (int64_t a = flat - 1; a >= 0; --a) {
        if (vars[a] < 0) continue;
        const Expr quotient = a == flat - 1 ? var(f) : binary(Op::Div, var(f), stride);
        indices.push_back(declare(vars[a], Type::I64, a == first_loop ? quotient : binary(Op::Rem, quotient, extent(id, a))));
        stride = a == flat - 1 ? extent(id, a) : binary(Op::Mul, stride, extent(id, a));
      }
      flat_count = stride;
      body.insert(body.begin(), indices.begin(), indices.end());
      body = {for_loop(f, int_const(0), flat_count, std::move(body), range)};
    }
    auto& pre = preludes_[0];
    body.insert(body.begin(), pre.begin(), pre.end());
    if (first_loop < 0) {  // no loop at all: a one-iteration outer loop keeps the ABI uniform
      body = {for_loop(new_var(), int_const(0), int_const(1), std::move(body), range)};
      kernel_.outer_extent = int_const(1);
    } else {
      kernel_.outer_extent = flat > 0 ? flat_count : extent(id, first_loop);
    }
    return block(std::move(body));
  }

  // How many leading axes of a loop nest run as one flat range loop: where iterations are
  // threads (CUDA), a thread per element, where the outermost loop alone gives a thread per row
  // (a [784, 700] optimizer update ran 784 threads, each walking a row with reads 2.8 KB apart
  // from its neighbours').
  // Axes down to the first depth with a prelude (a reduce computed once per row) flatten; the
  // CPU keeps its nest (threads split the outer loop, the inner one vectorises). 0: no change.
  int64_t flat_range_axes(const std::vector<int>& vars) const {
    if (!capabilities_.thread_per_iteration) return 0;
    const int64_t r = int64_t(vars.size());
    int64_t flat = r;
    for (int64_t k = 1; k < r; ++k)
      if (!preludes_[k].empty()) {
        flat = k;
        break;
      }
    int64_t loops = 0;
    for (int64_t a = 0; a < flat; ++a) loops += vars[a] >= 0;
    return loops >= 2 ? flat : 0;
  }

  // A group with only elementwise ops over same-shaped blocks runs as one flat loop.
  bool flat_group(int id) const {
    const LocalNode& n = node(id);
    if (!is_root(id) && mat_[id]) return n.local_shape == node(root_).local_shape;
    if (n.kind == LocalNode::Kind::Redistribute) return false;  // a view: needs per-axis indices
    if (n.op == OpKind::Full) return true;
    if (is_elementwise(n.op)) {
      for (int in : n.inputs)
        if (!flat_group(in)) return false;
      return true;
    }
    if (n.op == OpKind::Expand || n.op == OpKind::Reshape) return constant_only(n.inputs[0]);
    return false;
  }
  bool constant_only(int id) const {
    const LocalNode& n = node(id);
    if (mat_[id]) return false;
    if (n.op == OpKind::Full) return true;
    if (n.op == OpKind::Expand || n.op == OpKind::Reshape) return constant_only(n.inputs[0]);
    return false;
  }

  // Elementwise roots (several when sibling outputs share one loop nest, e.g. an optimizer's
  // updated moments and weight): one store per root, shared subexpressions computed once.
  void lower_elementwise_root() {
    bool flat = true;
    for (int r : roots_) flat &= flat_group(r);
    if (flat) {
      int v = new_var();
      Index idx;
      idx.flat = var(v);
      std::vector<StmtPtr> stores;
      for (size_t k = 0; k < roots_.size(); ++k) stores.push_back(store(int(k), var(v), convert(value(roots_[k], idx), ctype(roots_[k]))));
      kernel_.outer_extent = numel(root_);
      kernel_.body = block({for_loop(v, int_const(0), kernel_.outer_extent, std::move(stores), LoopKind::Parallel)});
      return;
    }
    std::vector<int> vars;
    root_index_ = make_loops(root_, vars);
    preludes_.assign(root_index_.size() + 1, {});
    Index idx{root_index_, nullptr};
    std::vector<StmtPtr> stores;
    for (size_t k = 0; k < roots_.size(); ++k)
      stores.push_back(store(int(k), linearize(roots_[k], root_index_), value(roots_[k], idx)));
    kernel_.body = nest(root_, vars, std::move(stores));
  }

  void lower_reduce_root() {
    const LocalNode& n = node(root_);
    fused(n);
    count_op(n, storage(root_));
    const int in = n.inputs[0];
    const int64_t in_rank = node(in).rank();
    const Type t = ctype(root_);
    std::vector<int> vars;
    root_index_ = make_loops(root_, vars);
    preludes_.assign(root_index_.size() + 1, {});
    if (n.op == OpKind::ArgMax) {
      // Index of the first maximum; the axis is whole on every device (the partitioner saw to it).
      const int64_t axis = n.attrs.axes[0];
      const Type vt = ctype(in);
      int best = new_var(), best_at = new_var(), k = new_var();
      Index in_idx;
      size_t j = 0;
      for (int64_t a = 0; a < in_rank; ++a) in_idx.axes.push_back(a == axis ? var(k) : root_index_[j++]);
      const ReadingReduced reading(*this);
      Expr v = value(in, in_idx);
      // A NaN beats everything but an earlier NaN (numpy's argmax returns the first NaN).
      Expr better = binary(Op::Lt, var(best, vt), v);
      if (is_float(vt))
        better = binary(Op::Or, better, binary(Op::And, binary(Op::Ne, v, v), binary(Op::Eq, var(best, vt), var(best, vt))));
      std::vector<StmtPtr> body = {
          declare(best, vt, identity(ReduceOp::Max, vt)), declare(best_at, Type::I64, int_const(0)),
          for_loop(k, int_const(0), extent(in, axis),
                   {assign(best_at, select(better, var(k), var(best_at, Type::I64))), assign(best, select(better, v, var(best, vt)))}),
          store(0, linearize(root_, root_index_), var(best_at, Type::I64))};
      kernel_.body = nest(root_, vars, std::move(body));
      return;
    }
    const ReduceOp op = reduce_op_of(n.op);
    // Whether a block runs each output does not depend on the per-row work reduce_loops may
    // inline; a warp's does (every lane would repeat it), so the strategy is asked again after.
    ReductionFacts facts = reduction_facts(root_);
    const ReductionStrategy planned = reduction_strategy(facts, capabilities_);
    if (planned.per_output) {
      // Row reduction: an accumulator per output element, reduced axes innermost. A block's
      // threads each add a strided share of the outermost reduced loop in a running sum (2^31
      // elements are 2^23 a thread: still exact for ones in f32); inner reduced loops cascade.
      int acc = new_var();
      const bool block = planned.threads == ReductionThreads::Block;
      std::vector<StmtPtr> body = reduce_loops(root_, root_index_, acc, op, planned.cascade, !block, planned.merged_loops);
      facts.has_preludes = has_preludes();  // reduce_loops may have inlined some
      const ReductionThreads threads = reduction_strategy(facts, capabilities_).threads;
      const auto first_loop = std::find_if(body.begin(), body.end(), [](const StmtPtr& st) { return st->kind == Stmt::Kind::For; });
      const bool in_order = first_loop != body.end() && threads == ReductionThreads::OrderedWarp;
      const bool lanes = first_loop != body.end() && threads != ReductionThreads::One;
      if (lanes) {  // the warp's lanes (the block's threads) split the outermost reduced loop
        (*first_loop)->loop = LoopKind::Lanes;
        (*first_loop)->reduce_var = acc;
        (*first_loop)->reduce_op = combining_op(op);
        (*first_loop)->lanes_in_order = in_order;
      }
      body.push_back(store_rounded(linearize(root_, root_index_), var(acc, t)));
      const LoopKind range = !lanes ? LoopKind::Parallel : block ? LoopKind::GpuBlock : LoopKind::GpuWarp;
      kernel_.body = nest(root_, vars, std::move(body), range);
      return;
    }
    // Column reduction: initialise the output, then stream the input in memory order and
    // accumulate into it (the inner loop runs over contiguous, non-reduced elements).
    std::vector<StmtPtr> init = {store(0, linearize(root_, root_index_), identity(op, t))};
    StmtPtr init_nest = nest(root_, vars, std::move(init));
    std::vector<int> in_vars;
    preludes_.assign(in_rank + 1, {});
    std::vector<Expr> in_index = make_loops(in, in_vars);
    std::vector<Expr> out_index;
    for (int64_t a = 0; a < in_rank; ++a)
      if (std::find(n.attrs.axes.begin(), n.attrs.axes.end(), a) == n.attrs.axes.end()) out_index.push_back(in_index[a]);
    Expr at = linearize(root_, out_index);
    root_index_.clear();  // reduces inlined here may only depend on nothing (computed once)
    const ReadingReduced reading(*this);
    Expr v = value(in, Index{in_index, nullptr});
    StmtPtr accumulate = nest(in, in_vars, {store_rounded(at, combine(op, load(0, storage(root_), at), v))});
    run_in_order(init_nest, accumulate);
  }

  // The kernel body for nests that accumulate into their output: its iterations depend on each
  // other, so `init` then `accumulate` run inside one ordered range loop of one iteration.
  void run_in_order(StmtPtr init, StmtPtr accumulate) {
    kernel_.outer_extent = int_const(1);
    const int once = new_var();
    kernel_.body = block({for_loop(once, int_const(0), int_const(1), {as_serial(std::move(init)), as_serial(std::move(accumulate))}, LoopKind::Ordered)});
  }

  // scatter_add_rows: zero the output, then add g's rows in order where their ids point (rows may
  // repeat, so one ordered range loop). Ids outside the output add zero to a clamped row.
  void lower_scatter_add_rows() {
    const LocalNode& n = node(root_);
    fused(n);
    if (capabilities_.thread_per_iteration) {
      if (few_scattered_rows(n)) return lower_scatter_add_rows_by_element();
      return lower_scatter_add_rows_by_column();
    }
    const int g = n.inputs[0], ids = n.inputs[1];
    const Type t = ctype(root_);
    std::vector<int> vars;
    root_index_ = make_loops(root_, vars);
    preludes_.assign(root_index_.size() + 1, {});
    StmtPtr init = nest(root_, vars, {store(0, linearize(root_, root_index_), identity(ReduceOp::Sum, t))});
    std::vector<int> g_vars;
    preludes_.assign(size_t(node(g).rank()) + 1, {});
    const std::vector<Expr> g_index = make_loops(g, g_vars);
    root_index_.clear();  // reduces inlined here may only depend on nothing (computed once)
    const LocalRow r = local_row(ids, std::vector<Expr>(g_index.begin(), g_index.end() - 1), root_);
    const Expr at = linearize(root_, {r.row, g_index.back()});
    const Expr added = select(r.inside, convert(value(g, Index{g_index, nullptr}), t), identity(ReduceOp::Sum, t));
    StmtPtr accumulate = nest(g, g_vars, {store_rounded(at, binary(Op::Add, load(0, storage(root_), at), added))});
    run_in_order(init, accumulate);
  }

  // Few output rows (a character vocabulary) times few g rows: a thread per output element scans
  // every id, which costs rows x g rows per column, and beats the per-column loop's chain of
  // dependent read-modify-writes. Global extents: every device lowers the same kernel.
  static constexpr int64_t kScanPerColumn = int64_t(1) << 21;
  bool few_scattered_rows(const LocalNode& n) const {
    const auto& g_shape = node(n.inputs[0]).global_shape;
    int64_t g_rows = 1;
    for (size_t a = 0; a + 1 < g_shape.size(); ++a) g_rows *= g_shape[a];
    const int64_t rows = n.global_shape[0];
    return storage(root_) == ctype(root_) && rows * g_rows <= kScanPerColumn;
  }

  // scatter_add_rows on CUDA, few rows: each output element sums, in a register and in row
  // order, the g rows whose id names it. The rows are the ones the ordered loop adds into it,
  // in its order; the zeros added for other rows leave a sum unchanged (a running sum from +0
  // is never -0). Outputs stored narrower than computed take the per-column loop, which rounds
  // every partial sum to storage as the ordered loop does.
  void lower_scatter_add_rows_by_element() {
    const LocalNode& n = node(root_);
    const int g = n.inputs[0], ids = n.inputs[1];
    const Type t = ctype(root_);
    const int f = new_var(), r = new_var(), acc = new_var();
    const Expr columns = extent(root_, 1);
    const Expr v = binary(Op::Div, var(f), columns), c = binary(Op::Rem, var(f), columns);
    preludes_.assign(1, {});
    root_index_.clear();  // reduces inlined here may only depend on nothing (computed once)
    const std::vector<Expr> id_index = unravel_rows(g, var(r));
    const LocalRow row = local_row(ids, id_index, root_);
    const Expr named = binary(Op::And, row.inside, binary(Op::Eq, row.row, v));
    const Expr added = select(named, convert(value(g, Index{with(id_index, c), nullptr}), t), identity(ReduceOp::Sum, t));
    run_in_parallel(f, binary(Op::Mul, extent(root_, 0), columns),
                    {declare(acc, t, identity(ReduceOp::Sum, t)),
                     for_loop(r, int_const(0), rows_of(g), {assign(acc, binary(Op::Add, var(acc, t), added))}),
                     store_rounded(var(f), var(acc, t))});
  }

  // scatter_add_rows on CUDA: a thread per column zeroes its column, then adds g's rows into it
  // in row order, reading and storing the output as the ordered loop does (the same bits, bf16
  // rounding included). Rows repeating an id meet only inside one thread; reads of g's rows are
  // coalesced across the threads.
  void lower_scatter_add_rows_by_column() {
    const LocalNode& n = node(root_);
    const int g = n.inputs[0], ids = n.inputs[1];
    const Type t = ctype(root_);
    const int c = new_var(), i = new_var(), r = new_var();
    const Expr columns = extent(root_, 1);
    preludes_.assign(1, {});
    root_index_.clear();  // reduces inlined here may only depend on nothing (computed once)
    const std::vector<Expr> id_index = unravel_rows(g, var(r));
    const LocalRow row = local_row(ids, id_index, root_);
    const Expr at = binary(Op::Add, binary(Op::Mul, row.row, columns), var(c));
    const Expr added = select(row.inside, convert(value(g, Index{with(id_index, var(c)), nullptr}), t), identity(ReduceOp::Sum, t));
    run_in_parallel(c, columns,
                    {for_loop(i, int_const(0), extent(root_, 0),
                              {store(0, binary(Op::Add, binary(Op::Mul, var(i), columns), var(c)), identity(ReduceOp::Sum, t))}),
                     for_loop(r, int_const(0), rows_of(g), {store_rounded(at, binary(Op::Add, load(0, storage(root_), at), added))})});
  }

  // g [..., D]'s rows, every axis but the last: their local count, and the per-axis index of
  // row `flat` in row-major order (the ids' index of that row).
  Expr rows_of(int g) const {
    Expr count = int_const(1);
    for (int64_t a = 0; a + 1 < node(g).rank(); ++a) count = binary(Op::Mul, count, extent(g, a));
    return count;
  }
  std::vector<Expr> unravel_rows(int g, const Expr& flat) const {
    const int64_t axes = node(g).rank() - 1;
    std::vector<Expr> index(static_cast<size_t>(axes));
    Expr rest = flat;
    for (int64_t a = axes - 1; a > 0; --a) {
      index[size_t(a)] = binary(Op::Rem, rest, extent(g, a));
      rest = binary(Op::Div, rest, extent(g, a));
    }
    if (axes > 0) index[0] = rest;
    return index;
  }
  static std::vector<Expr> with(std::vector<Expr> index, Expr last) {
    index.push_back(std::move(last));
    return index;
  }

  // The kernel body for a hand-made parallel range loop over [0, count) in `v`, after the
  // depth-0 prelude (reduces computed once).
  void run_in_parallel(int v, Expr count, std::vector<StmtPtr> per_iteration) {
    kernel_.outer_extent = count;
    std::vector<StmtPtr> body = preludes_[0];
    body.push_back(for_loop(v, int_const(0), std::move(count), std::move(per_iteration), LoopKind::Parallel));
    kernel_.body = block(std::move(body));
  }

  // Whether a check_index node's index `wide` (I64) lies outside its [lo, hi).
  static Expr index_outside(const LocalNode& n, const Expr& wide) {
    return binary(Op::Or, binary(Op::Lt, wide, int_const(int64_t(n.attrs.scalar))),
                  binary(Op::Le, int_const(int64_t(n.attrs.scalar2)), wide));
  }

  // check_index: copy the indices and record the first one outside [lo, hi) with this node in
  // the status word. One thread runs it (the word is shared); indices are few (labels, ids).
  void lower_check_index() {
    const LocalNode& n = node(root_);
    fused(n);
    if (capabilities_.thread_per_iteration) return lower_check_index_in_block();
    const Type t = ctype(root_);
    std::vector<int> vars;
    root_index_ = make_loops(root_, vars);
    preludes_.assign(root_index_.size() + 1, {});
    const Expr x = value(n.inputs[0], Index{root_index_, nullptr});
    const int status = int(kernel_.buffers.size());
    kernel_.buffers.push_back({Type::I64, true});
    kernel_.status_buffer = status;
    const int v = new_var(), bad = new_var();
    const Expr wide = cast(var(v, t), Type::I64);
    const Expr outside = index_outside(n, wide);
    const Expr first = binary(Op::And, outside, binary(Op::Eq, load(status, Type::I64, int_const(0)), int_const(0)));
    const Expr hit = binary(Op::Ne, var(bad), int_const(0));
    std::vector<StmtPtr> body = {
        declare(v, t, x),
        store(0, linearize(root_, root_index_), var(v, t)),
        declare(bad, Type::I64, select(first, int_const(1), int_const(0))),
        store(status, int_const(1), select(hit, wide, load(status, Type::I64, int_const(1)))),
        store(status, int_const(0), select(hit, int_const(root_ + 1), load(status, Type::I64, int_const(0))))};
    StmtPtr loops = as_serial(nest(root_, vars, std::move(body)));
    kernel_.outer_extent = int_const(1);
    const int once = new_var();
    kernel_.body = block({for_loop(once, int_const(0), int_const(1), {std::move(loops)}, LoopKind::Ordered)});
  }

  // check_index on CUDA: one block, its threads splitting the indices (one thread ran them all:
  // 0.14 ms over 4096 labels). Each copies its indices and keeps the smallest position of one
  // outside [lo, hi); the block's Min of those is the first in index order, the one the ordered
  // loop reports, and its value is read back from the copy (the combine's barrier made every
  // thread's stores visible). Every thread then stores the same words: it writes where the word
  // is clear or already this node's, so threads that see another's store agree. No block runs
  // for an empty input.
  void lower_check_index_in_block() {
    const LocalNode& n = node(root_);
    const Type t = ctype(root_);
    const int64_t r = n.rank();
    preludes_.assign(1, {});
    root_index_.clear();  // reduces inlined here may only depend on nothing (computed once)
    // Each axis's index from a flat (row-major) position.
    auto unflatten = [&](Expr flat) {
      std::vector<Expr> axes(static_cast<size_t>(r));
      for (int64_t a = r - 1; a >= 0; --a) {
        axes[size_t(a)] = a == 0 ? flat : binary(Op::Rem, flat, extent(root_, a));
        if (a > 0) flat = binary(Op::Div, flat, extent(root_, a));
      }
      return axes;
    };
    const int f = new_var(), v = new_var(), first = new_var(), once = new_var();
    const Expr count = numel(root_), none = int_const(std::numeric_limits<int64_t>::max());
    const std::vector<Expr> axes = unflatten(var(f));
    const Expr x = value(n.inputs[0], Index{axes, nullptr});
    const int status = int(kernel_.buffers.size());  // the last buffer (kernel_ir.hpp)
    kernel_.buffers.push_back({Type::I64, true});
    kernel_.status_buffer = status;
    StmtPtr lanes = for_loop(f, int_const(0), count,
                             {declare(v, t, x), store(0, linearize(root_, axes), var(v, t)),
                              assign(first, select(index_outside(n, cast(var(v, t), Type::I64)), binary(Op::Min, var(first), var(f)), var(first)))},
                             LoopKind::Lanes);
    lanes->reduce_var = first;
    lanes->reduce_op = Op::Min;
    const Expr found = binary(Op::Ne, var(first), none);
    const Expr at = linearize(root_, unflatten(select(found, var(first), int_const(0))));
    const Expr word = load(status, Type::I64, int_const(0)), mine = int_const(root_ + 1);
    const Expr hit = binary(Op::And, found, binary(Op::Or, binary(Op::Eq, word, int_const(0)), binary(Op::Eq, word, mine)));
    std::vector<StmtPtr> body = preludes_[0];
    body.push_back(declare(first, Type::I64, none));
    body.push_back(lanes);
    body.push_back(store(status, int_const(1), select(hit, cast(load(0, storage(root_), at), Type::I64), load(status, Type::I64, int_const(1)))));
    body.push_back(store(status, int_const(0), select(hit, mine, word)));
    kernel_.outer_extent = binary(Op::Min, count, int_const(1));
    kernel_.body = block({for_loop(once, int_const(0), kernel_.outer_extent, std::move(body), LoopKind::GpuBlock)});
  }

  // Nested loop nests must not claim the range loop.
  // A nest run in order inside an ordered loop: no range loop, and no loop whose iterations are
  // independent (it accumulates into its output, reading what earlier iterations wrote).
  static StmtPtr as_serial(StmtPtr s) {
    for (auto& b : s->body) {
      if (b->is_range_loop()) b->loop = LoopKind::Serial;
      b->independent = false;
      if (b->kind == Stmt::Kind::For) as_serial(b);
    }
    return s;
  }

  // Dot without a BLAS (integers, 16-bit floats), in each form of dsl/dot_form.hpp:
  // out[b.., m, n] = sum_k a[b.., m, k] * b[b.., k, n], and its Rows and ContractRows peers.
  void lower_dot() {
    const LocalNode& n = node(root_);
    fused(n);
    const int a = n.inputs[0], b = n.inputs[1];
    const int64_t r = n.rank(), ra = node(a).rank();
    const DotForm form = dot_form(ra, node(b).rank(), r);
    std::vector<int> vars;
    root_index_ = make_loops(root_, vars);
    preludes_.assign(r + 1, {});
    const Type t = ctype(root_);
    const int acc = new_var();
    // The contracted axes: k, or every row axis of a ContractRows product.
    std::vector<int> summed;
    Index ia{{}, nullptr}, ib = ia;
    switch (form) {
      case DotForm::Batched:  // [.., m, k] x [.., k, n]
        summed = {new_var()};
        ia.axes.assign(root_index_.begin(), root_index_.end() - 1);
        ia.axes.push_back(var(summed[0]));
        ib.axes.assign(root_index_.begin(), root_index_.end() - 2);
        ib.axes.push_back(var(summed[0]));
        ib.axes.push_back(root_index_[r - 1]);
        break;
      case DotForm::Rows:  // [.., k] x [k, n]
        summed = {new_var()};
        ia.axes.assign(root_index_.begin(), root_index_.end() - 1);
        ia.axes.push_back(var(summed[0]));
        ib.axes = {var(summed[0]), root_index_[r - 1]};
        break;
      case DotForm::ContractRows:  // [.., k]^T [.., n]
        for (int64_t ax = 0; ax + 1 < ra; ++ax) {
          summed.push_back(new_var());
          ia.axes.push_back(var(summed.back()));
        }
        ib.axes = ia.axes;
        ia.axes.push_back(root_index_[0]);
        ib.axes.push_back(root_index_[1]);
        break;
    }
    Expr product = binary(Op::Mul, convert(value(a, ia), t), convert(value(b, ib), t));
    std::vector<StmtPtr> sum = {assign(acc, binary(Op::Add, var(acc, t), product))};
    // Innermost the last contracted axis, so a's elements are read in order.
    for (size_t i = summed.size(); i-- > 0;) {
      const int64_t axis = form == DotForm::ContractRows ? int64_t(i) : ra - 1;
      sum = {for_loop(summed[i], int_const(0), extent(a, axis), std::move(sum))};
    }
    std::vector<StmtPtr> body = {declare(acc, t, identity(ReduceOp::Sum, t))};
    for (auto& stmt : sum) body.push_back(std::move(stmt));
    body.push_back(store_rounded(linearize(root_, root_index_), var(acc, t)));
    kernel_.body = nest(root_, vars, std::move(body));
  }

  const LocalProgram& p_;
  const IndexArithmetic index_;
  const int root_;
  const std::vector<int> roots_;
  const std::vector<bool>& mat_;
  std::vector<int>& buffer_nodes_;
  std::map<int, int> buffer_of_;
  std::map<int, Expr> hoisted_;
  // Keyed on the index expressions' addresses, so each entry holds its index: a consumer's index
  // built on the way and dropped would free an address a new index can take, which would then
  // find the old index's value (a load at another offset, chosen by the allocator's timing).
  struct MemoisedValue {
    Index index;
    Expr value;
  };
  std::map<std::vector<const void*>, MemoisedValue> values_;
  std::vector<Expr> root_index_;
  std::vector<std::vector<StmtPtr>> preludes_;
  int next_var_ = 0;
  // Above 0 while lowering what a reduction reads (count_op's per_reduced_element).
  int reading_reduced_ = 0;
  struct ReadingReduced {
    explicit ReadingReduced(Lowerer& l) : lowerer(l) { ++lowerer.reading_reduced_; }
    ~ReadingReduced() { --lowerer.reading_reduced_; }
    Lowerer& lowerer;
  };
  const LoopTarget target_;  // the range loop as the target runs it (retargeted)
  const LoopCapabilities capabilities_;  // every other choice of the target's
  Kernel kernel_;
};

}  // namespace

std::variant<kir::Kernel, FusionRefusal> lower_group(const LocalProgram& program, const std::vector<int>& roots,
                                                     const std::vector<bool>& materialised, std::vector<int>& buffer_nodes,
                                                     kir::LoopTarget target) {
  try {
    return Lowerer(program, roots, materialised, buffer_nodes, target).lower();
  } catch (const Refused& refused) {
    return refused.refusal;
  }
}

}  // namespace tessera
