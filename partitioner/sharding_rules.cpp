#include "partitioner/sharding_rules.hpp"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <set>

#include "dsl/attention_parts.hpp"
#include "dsl/dot_form.hpp"
#include "dsl/error.hpp"
#include "dsl/sharding_thresholds.hpp"

namespace tessera {
namespace {


using AxisLists = std::vector<std::vector<int64_t>>;
using PartialOps = std::vector<std::optional<ReduceOp>>;

std::optional<ReduceOp> partial_of(const Layout& l, int64_t d) { return l.partial_ops()[d]; }

PartialOps keep_partials(const Layout& l, const PartialOps& passing) {
  PartialOps out(passing.size());
  for (size_t d = 0; d < passing.size(); ++d)
    if (passing[d] && partial_of(l, int64_t(d)) == passing[d]) out[d] = passing[d];
  return out;
}

// An operand of a sum passing `passing`: split into terms where the sum passes a Partial(sum)
// (coordinate 0 keeps it); where it passes a Partial(avg), a whole operand is its own term.
PartialOps summed_terms(const Layout& l, const PartialOps& passing) {
  PartialOps out = keep_partials(l, passing);
  for (size_t d = 0; d < passing.size(); ++d)
    if (passing[d] == ReduceOp::Sum) out[d] = ReduceOp::Sum;
  return out;
}

// The mesh dims sharding input i's `axis`; none for a free input (it takes any layout).
std::vector<int64_t> sharding_of(const std::vector<Layout>& ins, const std::vector<bool>& free, size_t i, int64_t axis) {
  return free[i] ? std::vector<int64_t>{} : ins[i].axis_mesh_dims()[size_t(axis)];
}

// Drops mesh dims that `used` already claims, and claims the rest.
void claim(std::vector<int64_t>& dims, std::set<int64_t>& used) {
  std::erase_if(dims, [&](int64_t d) { return used.count(d) > 0; });
  used.insert(dims.begin(), dims.end());
}

AxisLists strip_dims(AxisLists lists, const PartialOps& partial) {
  for (auto& dims : lists) std::erase_if(dims, [&](int64_t d) { return partial[d].has_value(); });
  return lists;
}

// Zeros however they are laid out: a zero `full`, reshaped, permuted or broadcast. Such a
// constant is its own term of a partial sum (every device's share of zero is zero).
bool is_zero_constant(const Node& node) {
  const Node* n = &node;
  while (n->op == OpKind::Reshape || n->op == OpKind::Permute || n->op == OpKind::Expand || n->op == OpKind::Slice)
    n = n->inputs[0].get();
  return n->op == OpKind::Full && n->attrs.scalar == 0;
}

bool sharded_along(const Layout& layout, int64_t d) {
  for (const auto& dims : layout.axis_mesh_dims())
    if (std::find(dims.begin(), dims.end(), d) != dims.end()) return true;
  return false;
}

// Which input partials survive an elementwise op, per mesh dim.
PartialOps elementwise_partials(const Node& node, const std::vector<Layout>& ins, const std::vector<bool>& free) {
  const int64_t nd = ins[0].mesh().ndim();
  PartialOps out(nd);
  for (int64_t d = 0; d < nd; ++d) {
    std::vector<std::optional<ReduceOp>> p;
    int partial_count = 0;
    for (size_t i = 0; i < ins.size(); ++i) {
      p.push_back(free[i] ? std::nullopt : partial_of(ins[i], d));
      partial_count += p.back().has_value();
    }
    if (partial_count == 0) continue;
    auto all_are = [&](ReduceOp op) {
      for (auto& x : p)
        if (x != op) return false;
      return true;
    };
    auto only_partials_are = [&](ReduceOp op) {
      for (auto& x : p)
        if (x && *x != op) return false;
      return true;
    };
    const bool one_sum = partial_count == 1 && only_partials_are(ReduceOp::Sum);
    // The other operands are tensors whole along mesh dim d: split into terms (coordinate 0
    // keeps the value, the others zeros) they add to a partial sum with no communication, as
    // PyTorch's addmm (bias + mm(Shard(1), Shard(0)) is Partial). Constants are not split.
    bool others_split = true;
    for (size_t i = 0; i < ins.size(); ++i) {
      if (p[i]) continue;
      others_split &= !free[i] && !sharded_along(ins[i], d);
    }
    // A mean of terms is linear too, and needs no split: mean(t_i) + r = mean(t_i + r), and
    // mean(t_i) * r = mean(t_i * r) for any r whole along d, constants included (PyTorch keeps
    // Partial(avg) through these as through Partial(sum)).
    bool others_whole = true;
    for (size_t i = 0; i < ins.size(); ++i)
      if (!p[i]) others_whole &= free[i] || !sharded_along(ins[i], d);
    const bool avg_linear = only_partials_are(ReduceOp::Avg) && others_whole;
    const bool one_avg = partial_count == 1 && avg_linear;
    switch (node.op) {
      case OpKind::Add: case OpKind::Sub:
        if (all_are(ReduceOp::Sum) || (only_partials_are(ReduceOp::Sum) && others_split)) out[d] = ReduceOp::Sum;
        else if (avg_linear && is_floating(node.dtype)) out[d] = ReduceOp::Avg;
        break;
      case OpKind::Mul:
        if (one_sum) out[d] = ReduceOp::Sum;
        else if (one_avg && is_floating(node.dtype)) out[d] = ReduceOp::Avg;
        break;
      case OpKind::Div:  // integer division truncates each term: not linear, so the terms are added first
        if (one_sum && p[0] && is_floating(node.dtype)) out[d] = ReduceOp::Sum;
        else if (one_avg && p[0] && is_floating(node.dtype)) out[d] = ReduceOp::Avg;
        break;
      case OpKind::Neg:
        if (p[0] == ReduceOp::Sum || p[0] == ReduceOp::Avg) out[d] = p[0];
        break;
      case OpKind::StopGradient:  // the identity
        out[d] = p[0];
        break;
      case OpKind::Cast:
        if ((p[0] == ReduceOp::Sum || p[0] == ReduceOp::Avg) && is_floating(node.dtype) && is_floating(node.inputs[0]->dtype))
          out[d] = p[0];
        break;
      case OpKind::Where: {
        // where(c, a, b) picks, and so sums term by term, when the condition is the same on
        // every device of d and each branch is a partial sum, zeros, or a whole value split into
        // terms: the gradient of a pipeline stage's rows (this tick's weights selected by a
        // mask) stays Partial over dp through every microbatch and is reduced once.
        bool branches = !p[0] && (free[0] || !sharded_along(ins[0], d)) && (p[1] == ReduceOp::Sum || p[2] == ReduceOp::Sum);
        for (size_t i = 1; i < 3; ++i)
          branches &= p[i] == ReduceOp::Sum || (free[i] ? is_zero_constant(*node.inputs[i]) : !p[i] && !sharded_along(ins[i], d));
        if (branches) out[d] = ReduceOp::Sum;
        break;
      }
      case OpKind::Maximum:
        if (only_partials_are(ReduceOp::Max)) out[d] = ReduceOp::Max;
        break;
      case OpKind::Minimum:
        if (only_partials_are(ReduceOp::Min)) out[d] = ReduceOp::Min;
        break;
      default:
        break;
    }
  }
  return out;
}

ShardingDecision elementwise(const Node& node, const std::vector<Layout>& ins, const std::vector<bool>& free,
                             const RedistributeCostFn& cost) {
  const Mesh& mesh = ins[0].mesh();
  const PartialOps passing = elementwise_partials(node, ins, free);
  std::vector<AxisLists> candidates;
  for (size_t i = 0; i < ins.size(); ++i)
    if (!free[i]) candidates.push_back(strip_dims(ins[i].axis_mesh_dims(), passing));
  candidates.push_back(AxisLists(node.rank()));
  // A large partial sum that cannot pass may be reduce_scattered onto a free axis instead of
  // all_reduced: half the bytes, and the op then runs on 1/N of the data. (Small values keep
  // one all_reduce: a later all_gather would cost another collective's latency.)
  const bool large = node.numel() * dtype_size(node.dtype) >= kShardingMinimumBytes;
  for (size_t i = 0; large && i < ins.size(); ++i) {
    if (free[i] || node.rank() == 0) continue;
    AxisLists lists = strip_dims(ins[i].axis_mesh_dims(), passing);
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < mesh.ndim(); ++d)
      if (partial_of(ins[i], d) == ReduceOp::Sum && !passing[d]) dims.push_back(d);
    for (auto& axis : lists)
      if (axis.empty() && !dims.empty()) {
        axis = dims;
        dims.clear();
      }
    if (dims.empty()) candidates.push_back(lists);
  }
  std::optional<ShardingDecision> best;
  int64_t best_cost = 0;
  for (size_t c = 0; c < candidates.size(); ++c) {
    const AxisLists& lists = candidates[c];
    // Costs are never negative, and a later candidate must cost strictly less to win: past a
    // free one, or a repeat of one tried (operands in one layout), nothing can.
    if (best && best_cost == 0) break;
    if (std::find(candidates.begin(), candidates.begin() + ptrdiff_t(c), lists) != candidates.begin() + ptrdiff_t(c)) continue;
    ShardingDecision d{Layout(mesh, lists, passing), {}};
    int64_t total = 0;
    for (size_t i = 0; i < ins.size(); ++i) {
      // A sum's operands, and a where's branches, all become terms of the partial sums it
      // passes (see elementwise_partials).
      const bool terms = node.op == OpKind::Add || node.op == OpKind::Sub || (node.op == OpKind::Where && i > 0);
      d.inputs.push_back(free[i] ? Layout(mesh, lists) : Layout(mesh, lists, terms ? summed_terms(ins[i], passing) : keep_partials(ins[i], passing)));
      if (!free[i]) total += cost(*node.inputs[i], ins[i], d.inputs.back());
    }
    if (!best || total < best_cost) {
      best = std::move(d);
      best_cost = total;
    }
  }
  return *best;
}

}  // namespace

bool avoid_partial_sum(DType dtype, const Target& target) { return target.deterministic && is_floating(dtype); }

namespace {

// The dot's layouts with the operands' partial sums passed on to the output (pass_partials), or
// with the operands reduced first.
// With whole_contraction, the contraction is never split (its operands gathered along it).
ShardingDecision dot_layouts(const Node& node, const std::vector<Layout>& ins, const std::vector<bool>& free, const Target& target,
                             bool pass_partials, bool whole_contraction = false) {
  const Layout &a = ins[0], &b = ins[1];
  const Mesh& mesh = a.mesh();
  const int64_t ra = node.inputs[0]->rank(), rb = node.inputs[1]->rank(), r = node.rank(), nd = mesh.ndim();
  const DotForm form = dot_form(ra, rb, r);
  const AxisLists &la = a.axis_mesh_dims(), &lb = b.axis_mesh_dims();
  const AxisLists& A = free[0] ? AxisLists(size_t(ra)) : la;
  const AxisLists& B = free[1] ? AxisLists(size_t(rb)) : lb;
  std::set<int64_t> used;
  // With pass_partials, operands' partial sums (and means: a product is linear in each operand)
  // pass when the other operand is not partial there.
  PartialOps out_partial(nd), keep_a(nd), keep_b(nd);
  auto linear = [&](const std::optional<ReduceOp>& p) { return p == ReduceOp::Sum || (p == ReduceOp::Avg && is_floating(node.dtype)); };
  for (int64_t d = 0; pass_partials && d < nd; ++d) {
    auto pa = free[0] ? std::nullopt : partial_of(a, d), pb = free[1] ? std::nullopt : partial_of(b, d);
    if (linear(pa) && !pb) keep_a[d] = out_partial[d] = pa;
    if (linear(pb) && !pa) keep_b[d] = out_partial[d] = pb;
    if (out_partial[d]) used.insert(d);
  }
  const bool split_contraction = !avoid_partial_sum(node.dtype, target) && !whole_contraction;
  AxisLists out(r), req_a(ra), req_b(rb);
  // A sharded contraction leaves each device its slice's sum: Partial(sum) there.
  auto contract = [&](std::vector<int64_t> dims) {
    if (!split_contraction) dims.clear();  // gather the contraction instead
    claim(dims, used);
    for (int64_t d : dims) out_partial[d] = ReduceOp::Sum;
    return dims;
  };
  if (form == DotForm::ContractRows) {
    // [..., k] x [..., n] -> [k, n]: every leading axis is contracted, k and n are kept.
    for (int64_t ax = 0; ax < ra - 1; ++ax) req_a[ax] = req_b[ax] = contract(!A[ax].empty() ? A[ax] : B[ax]);
    std::vector<int64_t> k = A[ra - 1], n = B[rb - 1];
    claim(k, used);
    claim(n, used);
    out[0] = req_a[ra - 1] = k;
    out[1] = req_b[rb - 1] = n;
    return {Layout(mesh, out, out_partial), {Layout(mesh, req_a, keep_a), Layout(mesh, req_b, keep_b)}};
  }
  // Batched: batch axes follow a's sharding, else b's, and claim their mesh dims before the
  // contraction does; m follows a, after it. Rows: every leading axis of a is a row axis, m's
  // peer, so the contraction claims first (as in the 2-D product a [B*T, k] x [k, n]).
  const int64_t batch_axes = form == DotForm::Batched ? r - 2 : 0;
  for (int64_t ax = 0; ax < batch_axes; ++ax) {
    std::vector<int64_t> dims = !A[ax].empty() ? A[ax] : B[ax];
    claim(dims, used);
    out[ax] = req_a[ax] = req_b[ax] = dims;
  }
  std::vector<int64_t> k = contract(!A[ra - 1].empty() ? A[ra - 1] : B[rb - 2]);
  for (int64_t ax = batch_axes; ax < ra - 1; ++ax) {
    std::vector<int64_t> rows = A[ax];
    claim(rows, used);
    out[ax] = req_a[ax] = rows;
  }
  std::vector<int64_t> n = B[rb - 1];
  claim(n, used);
  req_a[ra - 1] = req_b[rb - 2] = k;
  req_b[rb - 1] = out[r - 1] = n;
  return {Layout(mesh, out, out_partial), {Layout(mesh, req_a, keep_a), Layout(mesh, req_b, keep_b)}};
}

// A partial operand may pass its sum on to the output, or be reduced first. Passing is free here
// but costs later: the (maybe larger) output must be reduced, and the mesh dim the sum occupies
// cannot shard the other operand, which is then gathered. A tensor-parallel backward shows both:
// a Partial dY [tokens, width] times a row-parallel weight passed on gathers the weight and
// leaves a Partial [tokens, 4 * width] whose consumers gather their sharded activations; reduced
// first, the product comes out sharded like the forward's. The cheaper, counting the reduction
// each output still owes, wins. That debt is priced as an all_reduce, an upper bound (a consumer
// wanting shards pays a reduce_scatter; partial products summed before one reduction share it),
// so the estimate leans towards reducing early. Deterministic runs always reduce first: a sum
// of per-device products depends on the split.
ShardingDecision dot(const Node& node, const std::vector<Layout>& ins, const std::vector<bool>& free, const RedistributeCostFn& cost,
                     const Target& target) {
  ShardingDecision passing = dot_layouts(node, ins, free, target, true);
  const bool passes_a_sum = passing.inputs[0].has_partial() || passing.inputs[1].has_partial();
  if (passes_a_sum && avoid_partial_sum(node.dtype, target)) return dot_layouts(node, ins, free, target, false);
  auto total = [&](const ShardingDecision& d) {
    int64_t c = 0;
    for (size_t i = 0; i < 2; ++i)
      if (!free[i]) c += cost(*node.inputs[i], ins[i], d.inputs[i]);
    if (d.output.has_partial()) c += cost(node, d.output, d.output.without_partial());
    return c;
  };
  // A split contraction only pays when its operands already lie split along it: moving an
  // operand onto the contraction (an all_to_all) and then reducing the product can cost more
  // than gathering the other operand whole (two Shard(0) operands: PyTorch gathers the right one).
  const int64_t ra = node.inputs[0]->rank();
  const bool contracts_rows = dot_form(ra, node.inputs[1]->rank(), node.rank()) == DotForm::ContractRows;
  const AxisLists& a_passing = passing.inputs[0].axis_mesh_dims();
  bool a_split_along_contraction = !contracts_rows && !a_passing[size_t(ra - 1)].empty();
  for (int64_t ax = 0; contracts_rows && ax < ra - 1; ++ax) a_split_along_contraction |= !a_passing[size_t(ax)].empty();
  const bool moves_onto_contraction =
      cost(*node.inputs[0], ins[0], passing.inputs[0]) > 0 && !free[0] && a_split_along_contraction;
  if (!passes_a_sum && !moves_onto_contraction) return passing;
  ShardingDecision best = passing;
  int64_t best_cost = total(passing);
  auto consider = [&](ShardingDecision d) {
    if (const int64_t c = total(d); c < best_cost) {
      best = std::move(d);
      best_cost = c;
    }
  };
  if (passes_a_sum) consider(dot_layouts(node, ins, free, target, false));
  if (moves_onto_contraction) consider(dot_layouts(node, ins, free, target, passes_a_sum, true));
  return best;
}

// Fused attention (dsl/attention_parts.hpp). Leading (batch, head) axes keep the first sharding
// among q, k and v; q's sequence may stay sharded, its rows being independent (the causal mask
// reads their global offsets), and the forward, d_out and dq rows follow it; k and v are whole
// along theirs and every feature axis is whole. grad_kv sums over the query shards, so it is
// Partial(sum) there, unless deterministic runs keep the sum on one device.
ShardingDecision attention(const Node& node, const std::vector<Layout>& ins, const std::vector<bool>& free, const Target& target) {
  const Mesh& mesh = ins[0].mesh();
  const int64_t r = node.rank();
  std::set<int64_t> used;
  AxisLists batch(r);
  for (int64_t ax = 0; ax < r - 2; ++ax) {
    std::vector<int64_t> dims;
    for (size_t i = 0; i < 3 && dims.empty(); ++i) dims = sharding_of(ins, free, i, ax);
    claim(dims, used);
    batch[ax] = dims;
  }
  const AttentionPart part = attention_attrs(node.attrs).part;
  std::vector<int64_t> rows = sharding_of(ins, free, 0, r - 2);
  if (part == AttentionPart::GradKV && avoid_partial_sum(node.dtype, target)) rows.clear();
  claim(rows, used);
  AxisLists by_rows = batch;
  by_rows[r - 2] = rows;
  std::vector<Layout> required = {Layout(mesh, by_rows), Layout(mesh, batch), Layout(mesh, batch)};
  for (size_t i = 3; i < attention_operand_count(part); ++i) required.push_back(Layout(mesh, by_rows));  // forward, d_out
  if (ins.size() > attention_operand_count(part)) required.push_back(Layout(mesh, AxisLists(0)));  // the mask's shift
  if (part != AttentionPart::GradKV) return {Layout(mesh, by_rows), required};
  PartialOps partial(size_t(mesh.ndim()));
  for (int64_t d : rows) partial[size_t(d)] = ReduceOp::Sum;
  return {Layout(mesh, batch, partial), required};
}

// take_rows (table [V, D], ids [...]) -> [..., D]: each axis of rows follows the ids' sharding,
// columns the table's. A table sharded over V is read where it lies: each device picks the ids
// its block holds and zeros for the rest, so the result is Partial(sum) there (PyTorch's
// vocab-parallel embedding). One term of that sum is the row and the others are zero, so its
// value does not depend on the split, and deterministic runs keep it too. A mesh dim sharding
// both V and the ids serves one of them: given to V, the ids are gathered over it and the result
// owes a reduction there; given to the ids, the whole table is gathered. The table keeps it when
// it is larger than the ids and the result together (a few rows picked from a large table).
ShardingDecision take_rows(const Node& node, const std::vector<Layout>& ins, const std::vector<bool>& free) {
  const int64_t extent = node.inputs[0]->shape[0], id_axes = node.inputs[1]->rank();
  const Mesh& mesh = ins[0].mesh();
  std::vector<int64_t> vocabulary = sharding_of(ins, free, 0, 0);
  int64_t shards = 1;
  for (int64_t d : vocabulary) shards *= mesh.shape()[size_t(d)];
  if (shards > extent) vocabulary.clear();  // every device's block must hold a row to read
  auto bytes = [](const Node& n) { return n.numel() * dtype_size(n.dtype); };
  const bool table_first = bytes(*node.inputs[0]) > bytes(*node.inputs[1]) + bytes(node);
  std::set<int64_t> used;
  if (table_first) claim(vocabulary, used);
  AxisLists out(static_cast<size_t>(id_axes + 1)), ids(static_cast<size_t>(id_axes));
  for (int64_t ax = 0; ax < id_axes; ++ax) {
    std::vector<int64_t> rows = sharding_of(ins, free, 1, ax);
    claim(rows, used);
    out[size_t(ax)] = ids[size_t(ax)] = rows;
  }
  std::vector<int64_t> columns = sharding_of(ins, free, 0, 1);
  claim(columns, used);
  out.back() = columns;
  if (!table_first) claim(vocabulary, used);
  PartialOps partial(size_t(mesh.ndim()));
  for (int64_t d : vocabulary) partial[size_t(d)] = ReduceOp::Sum;
  return {Layout(mesh, out, partial), {Layout(mesh, AxisLists{vocabulary, columns}), Layout(mesh, ids)}};
}

// scatter_add_rows (g [..., D], ids [...]) -> [V, D]: each device adds its rows of g, so rows
// sharded along any axis give Partial(sum) (gathered instead in deterministic runs, which add
// every row in order on one device); columns follow g's.
ShardingDecision scatter_add_rows(const Node& node, const std::vector<Layout>& ins, const std::vector<bool>& free,
                                  const Target& target) {
  const Mesh& mesh = ins[0].mesh();
  const int64_t id_axes = node.inputs[1]->rank();
  std::set<int64_t> used;
  AxisLists g(static_cast<size_t>(id_axes + 1)), ids(static_cast<size_t>(id_axes));
  PartialOps partial(size_t(mesh.ndim()));
  for (int64_t ax = 0; ax < id_axes; ++ax) {
    std::vector<int64_t> rows = free[0] ? sharding_of(ins, free, 1, ax) : sharding_of(ins, free, 0, ax);
    if (avoid_partial_sum(node.dtype, target)) rows.clear();
    claim(rows, used);
    for (int64_t d : rows) partial[size_t(d)] = ReduceOp::Sum;
    g[size_t(ax)] = ids[size_t(ax)] = rows;
  }
  std::vector<int64_t> columns = sharding_of(ins, free, 0, id_axes);
  claim(columns, used);
  g.back() = columns;
  // g's own partial sums pass on: each device scatters its terms with the same ids (a position
  // embedding's gradient over dp-sharded microbatches, reduced once instead of per microbatch).
  PartialOps keep(size_t(mesh.ndim()));
  for (int64_t d = 0; d < mesh.ndim() && !free[0] && !avoid_partial_sum(node.dtype, target); ++d)
    if (partial_of(ins[0], d) == ReduceOp::Sum && !used.count(d)) keep[size_t(d)] = partial[size_t(d)] = ReduceOp::Sum;
  return {Layout(mesh, AxisLists{{}, columns}, partial), {Layout(mesh, g, keep), Layout(mesh, ids)}};
}

// grouped_dot (x [N, K], w [E, K, F], ends [E]) -> [N, F] (dsl/grouped_matmul.hpp), PyTorch's
// rules for torch._grouped_mm: w split on F gives an output split on its last axis; x and w split
// on K give Partial(sum) (gathered instead in deterministic runs). x's rows may stay split too:
// the group bounds are global rows and each device computes the part of each group it holds.
// The experts axis and the ends are whole on every device (a device's rows may meet any expert).
ShardingDecision grouped_dot(const Node& node, const std::vector<Layout>& ins, const std::vector<bool>& free, const Target& target) {
  const Mesh& mesh = ins[0].mesh();
  std::set<int64_t> used;
  std::vector<int64_t> rows = sharding_of(ins, free, 0, 0);
  claim(rows, used);
  std::vector<int64_t> k = sharding_of(ins, free, 0, 1);
  if (k.empty()) k = sharding_of(ins, free, 1, 1);
  if (avoid_partial_sum(node.dtype, target)) k.clear();
  claim(k, used);
  std::vector<int64_t> f = sharding_of(ins, free, 1, 2);
  claim(f, used);
  PartialOps partial(size_t(mesh.ndim()));
  for (int64_t d : k) partial[size_t(d)] = ReduceOp::Sum;
  return {Layout(mesh, AxisLists{rows, f}, partial),
          {Layout(mesh, AxisLists{rows, k}), Layout(mesh, AxisLists{{}, k, f}), Layout::replicated(mesh, 1)}};
}

// grouped_weight_grad (x [N, K], dy [N, F], ends [E]) -> [E, K, F]: each device sums over the
// rows it holds, so rows split give Partial(sum) (gathered in deterministic runs); K follows x,
// F follows dy.
ShardingDecision grouped_weight_grad(const Node& node, const std::vector<Layout>& ins, const std::vector<bool>& free,
                                     const Target& target) {
  const Mesh& mesh = ins[0].mesh();
  std::set<int64_t> used;
  std::vector<int64_t> rows = sharding_of(ins, free, 0, 0);
  if (rows.empty()) rows = sharding_of(ins, free, 1, 0);
  if (avoid_partial_sum(node.dtype, target)) rows.clear();
  claim(rows, used);
  std::vector<int64_t> k = sharding_of(ins, free, 0, 1);
  claim(k, used);
  std::vector<int64_t> f = sharding_of(ins, free, 1, 1);
  claim(f, used);
  PartialOps partial(size_t(mesh.ndim()));
  for (int64_t d : rows) partial[size_t(d)] = ReduceOp::Sum;
  return {Layout(mesh, AxisLists{{}, k, f}, partial),
          {Layout(mesh, AxisLists{rows, k}), Layout(mesh, AxisLists{rows, f}), Layout::replicated(mesh, 1)}};
}

}  // namespace

ShardingDecision dot_producing(const Node& node, const Layout& output) {
  const int64_t ra = node.inputs[0]->rank(), rb = node.inputs[1]->rank(), r = node.rank();
  const AxisLists& out = output.axis_mesh_dims();
  AxisLists req_a(ra), req_b(rb);  // the contraction gathered
  switch (dot_form(ra, rb, r)) {
    case DotForm::Batched:
      req_a = req_b = out;
      req_a[r - 1].clear();
      req_b[r - 2].clear();
      break;
    case DotForm::Rows:
      req_a = out;
      req_a[r - 1].clear();
      req_b[1] = out[r - 1];
      break;
    case DotForm::ContractRows:
      req_a[ra - 1] = out[0];
      req_b[rb - 1] = out[1];
      break;
  }
  return {output, {Layout(output.mesh(), req_a), Layout(output.mesh(), req_b)}};
}

namespace {

ShardingDecision reduce(const Node& node, const Layout& in, const Target& target) {
  const Mesh& mesh = in.mesh();
  const std::vector<int64_t>& axes = node.attrs.axes;
  const AxisLists& lists = in.axis_mesh_dims();
  AxisLists out, req = lists;
  PartialOps out_partial(mesh.ndim()), keep(mesh.ndim());
  if (node.op == OpKind::ArgMax) {
    req[axes[0]].clear();  // the winner must be found where the whole axis is
    for (int64_t a = 0; a < in.rank(); ++a)
      if (a != axes[0]) out.push_back(lists[a]);
    return {Layout(mesh, out), {Layout(mesh, req)}};
  }
  const ReduceOp op = reduce_op_of(node.op);
  const bool gather = (op == ReduceOp::Sum || op == ReduceOp::Product) && avoid_partial_sum(node.dtype, target);
  for (int64_t d = 0; d < mesh.ndim(); ++d)
    if (partial_of(in, d) == op && !gather) keep[d] = out_partial[d] = op;
  for (int64_t a = 0; a < in.rank(); ++a) {
    if (std::binary_search(axes.begin(), axes.end(), a)) {
      if (gather) req[a].clear();  // the whole axis on every device, reduced in one order
      else
        for (int64_t d : lists[a]) out_partial[d] = op;
    } else {
      out.push_back(lists[a]);
    }
  }
  return {Layout(mesh, out, out_partial), {Layout(mesh, req, keep)}};
}

// Reshape axis groups: input axis -> output axis for the axes whose sharding a reshape keeps.
// An axis passing through unchanged keeps it. So does the outermost axis of a merged or split
// group ([B, T] -> [B*T], or back) when keeps(in_axis, out_axis) says its shard count divides
// both outermost extents: each device's block is then the same contiguous run of the group's
// elements on both sides (PyTorch's view rule for Shard on a flattened group's first dim).
std::vector<int64_t> reshape_passthrough(const std::vector<int64_t>& in, const std::vector<int64_t>& out,
                                         const std::function<bool(size_t, size_t)>& keeps) {
  std::vector<int64_t> map(in.size(), -1);
  for (int64_t e : in)
    if (e == 0) return map;  // no elements: nothing to keep sharded (and products cannot be matched)
  size_t i = 0, j = 0;
  while (i < in.size() && j < out.size()) {
    // Equal extents pass through, size-1 ones included when both sides have one here (PyTorch's
    // view rule pairs singletons): a size-1 axis sharded unevenly, one device holding the row and
    // the others empty blocks, keeps its shard.
    if (in[i] == out[j]) {
      map[i] = int64_t(j);
      ++i, ++j;
      continue;
    }
    if (in[i] == 1) { ++i; continue; }
    if (out[j] == 1) { ++j; continue; }
    // A merged or split group: walk until the products agree.
    const size_t outer_in = i, outer_out = j;
    int64_t pi = in[i++], pj = out[j++];
    while (pi != pj && (i < in.size() || j < out.size())) {
      if ((pi < pj && i < in.size()) || j == out.size()) pi *= in[i++];
      else pj *= out[j++];
    }
    if (pi == pj && keeps(outer_in, outer_out)) map[outer_in] = int64_t(outer_out);
  }
  return map;
}

// Whether an axis split `shards` ways divides both extents evenly.
bool divides_both(int64_t shards, int64_t a, int64_t b) { return a % shards == 0 && b % shards == 0; }

int64_t shard_count(const Mesh& mesh, const std::vector<int64_t>& mesh_dims) {
  int64_t n = 1;
  for (int64_t d : mesh_dims) n *= mesh.shape()[size_t(d)];
  return n;
}

// Movement ops: output sharding from the input's, and the input sharding that allows it.
ShardingDecision movement(const Node& node, const std::vector<Layout>& ins, const std::vector<bool>& free) {
  const Layout& in = ins[0];
  const Mesh& mesh = in.mesh();
  const int64_t r = node.rank();
  const AxisLists& lists = in.axis_mesh_dims();
  PartialOps partial = in.partial_ops();
  AxisLists out(r), req = lists;
  switch (node.op) {
    case OpKind::Permute:
      for (int64_t a = 0; a < r; ++a) out[a] = lists[node.attrs.axes[a]];
      break;
    case OpKind::Expand:
      for (int64_t a = 0; a < r; ++a) {
        if (node.inputs[0]->shape[a] != node.shape[a]) req[a].clear();
        out[a] = req[a];
      }
      break;
    case OpKind::Reshape: {
      const std::vector<int64_t>& in_shape = node.inputs[0]->shape;
      std::vector<int64_t> map = reshape_passthrough(in_shape, node.shape, [&](size_t i, size_t j) {
        return divides_both(shard_count(mesh, lists[i]), in_shape[i], node.shape[j]);
      });
      for (size_t a = 0; a < map.size(); ++a) {
        if (map[a] < 0) req[a].clear();
        else out[map[a]] = lists[a];
      }
      break;
    }
    case OpKind::Slice: case OpKind::Pad:
      for (int64_t a = 0; a < r; ++a) {
        if (node.inputs[0]->shape[a] != node.shape[a] || (node.op == OpKind::Slice && node.attrs.lo[a] != 0)) req[a].clear();
        out[a] = req[a];
      }
      if (node.op == OpKind::Pad)
        for (auto& p : partial)
          if (p && !(*p == ReduceOp::Sum && node.attrs.scalar == 0)) p.reset();
      break;
    case OpKind::Concat: {
      // The operand sharded over the most mesh dims off the concat axis sets the layout: the
      // others, replicated ones above all, then take their blocks locally instead of the sharded
      // one being gathered.
      const int64_t axis = node.attrs.axes[0];
      auto sharded_dims = [&](size_t i) {
        size_t n = 0;
        for (int64_t a = 0; a < r; ++a)
          if (a != axis) n += ins[i].axis_mesh_dims()[size_t(a)].size();
        return n;
      };
      size_t first = 0;
      while (first + 1 < ins.size() && free[first]) ++first;
      for (size_t i = first + 1; i < ins.size(); ++i)
        if (!free[i] && sharded_dims(i) > sharded_dims(first)) first = i;
      req = ins[first].axis_mesh_dims();
      req[axis].clear();
      out = req;
      partial = ins[first].partial_ops();
      for (size_t i = 0; i < ins.size(); ++i)
        for (size_t d = 0; d < partial.size(); ++d)
          if (free[i] || ins[i].partial_ops()[d] != partial[d]) partial[d].reset();
      ShardingDecision decision{Layout(mesh, out, partial), {}};
      for (size_t i = 0; i < ins.size(); ++i) decision.inputs.push_back(Layout(mesh, req, free[i] ? PartialOps{} : partial));
      return decision;
    }
    default:
      throw InternalError("movement rule for a non-movement op");
  }
  return {Layout(mesh, out, partial), {Layout(mesh, req, partial)}};
}

}  // namespace

ShardingDecision decide_sharding(const Node& node, const std::vector<Layout>& ins, const std::vector<bool>& free,
                                 const RedistributeCostFn& cost, const Target& target) {
  if (node.op == OpKind::WithLayout) return {*node.attrs.layout, {*node.attrs.layout}};
  if (node.op == OpKind::Dot) return dot(node, ins, free, cost, target);
  if (node.op == OpKind::Attention) return attention(node, ins, free, target);
  if (node.op == OpKind::GroupedDot) return grouped_dot(node, ins, free, target);
  if (node.op == OpKind::GroupedWeightGrad) return grouped_weight_grad(node, ins, free, target);
  if (node.op == OpKind::TakeRows) return take_rows(node, ins, free);
  if (node.op == OpKind::ScatterAddRows) return scatter_add_rows(node, ins, free, target);
  if (is_reduce(node.op)) return reduce(node, ins[0], target);
  if (is_movement(node.op)) return movement(node, ins, free);
  if (is_elementwise(node.op)) return elementwise(node, ins, free, cost);
  throw InternalError("decide_sharding: no rule for " + std::string(op_name(node.op)));
}

std::optional<std::vector<Layout>> layouts_producing(const Node& node, const Layout& output) {
  if (output.has_partial()) return std::nullopt;
  const Mesh& mesh = output.mesh();
  const AxisLists& lists = output.axis_mesh_dims();
  const int64_t r = node.rank();
  if (is_elementwise(node.op)) return std::vector<Layout>(node.inputs.size(), output);
  switch (node.op) {
    case OpKind::Full: case OpKind::Iota: case OpKind::RandomUniform: case OpKind::RandomNormal:
      return std::vector<Layout>{};
    case OpKind::Permute: {
      AxisLists in(r);
      for (int64_t a = 0; a < r; ++a) in[node.attrs.axes[a]] = lists[a];
      return std::vector<Layout>{Layout(mesh, in)};
    }
    case OpKind::Expand: {
      AxisLists in = lists;
      for (int64_t a = 0; a < r; ++a)
        if (node.inputs[0]->shape[a] != node.shape[a]) in[a].clear();  // a broadcast axis: any sharding is local
      return std::vector<Layout>{Layout(mesh, in)};
    }
    case OpKind::Reshape: {
      const std::vector<int64_t>& in_shape = node.inputs[0]->shape;
      std::vector<int64_t> map = reshape_passthrough(in_shape, node.shape, [&](size_t i, size_t j) {
        return divides_both(shard_count(mesh, lists[j]), in_shape[i], node.shape[j]);
      });
      AxisLists in(node.inputs[0]->rank());
      std::vector<bool> covered(r, false);
      for (size_t a = 0; a < map.size(); ++a)
        if (map[a] >= 0) {
          in[a] = lists[map[a]];
          covered[map[a]] = true;
        }
      for (int64_t a = 0; a < r; ++a)
        if (!covered[a] && !lists[a].empty()) return std::nullopt;
      return std::vector<Layout>{Layout(mesh, in)};
    }
    case OpKind::Slice: case OpKind::Pad:
      for (int64_t a = 0; a < r; ++a)
        if (!lists[a].empty() && node.inputs[0]->shape[a] != node.shape[a]) return std::nullopt;
      return std::vector<Layout>{output};
    case OpKind::Concat:
      if (!lists[node.attrs.axes[0]].empty()) return std::nullopt;
      return std::vector<Layout>(node.inputs.size(), output);
    default:
      return std::nullopt;
  }
}

}  // namespace tessera
