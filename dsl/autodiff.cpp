#include "dsl/autodiff.hpp"

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "dsl/all_to_all_v.hpp"
#include "dsl/attention.hpp"
#include "dsl/attention_parts.hpp"
#include "dsl/checkpoint.hpp"
#include "dsl/comm_module_scope.hpp"
#include "dsl/dot_form.hpp"
#include "dsl/gradient_rule.hpp"
#include "dsl/grouped_matmul.hpp"
#include "dsl/indexing.hpp"
#include "dsl/local_map.hpp"
#include "dsl/ops.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

// A constant filled with `value`, with no layout of its own (it takes its consumer's).
Tensor constant_like(const NodeRef& like, double value) {
  NodeAttrs attrs;
  attrs.scalar = value;
  if (like->extents)  // local blocks of uneven extents: a scalar broadcast to them
    return detail::broadcast_like(Tensor(make_node(OpKind::Full, like->dtype, {}, {}, attrs, like->where)), like, like->where);
  return Tensor(make_node(OpKind::Full, like->dtype, like->shape, {}, attrs, like->where));
}

// Sums `g` (shaped like an expand's output) back to the expand's input shape.
Tensor unbroadcast(const Tensor& g, const NodeRef& input, Loc loc) {
  std::vector<int64_t> axes;
  for (int64_t a = 0; a < input->rank(); ++a)
    if (input->shape[a] != g.shape()[a]) axes.push_back(a);
  if (axes.empty()) return g;
  return reduce_sum(g, axes, true, loc);
}

// The reduce's output broadcast back over the reduced axes of its input.
Tensor expand_back(const Tensor& t, const Node& reduce, Loc loc) {
  std::vector<int64_t> kept = reduce.inputs[0]->shape;
  for (int64_t a : reduce.attrs.axes) kept[a] = 1;
  return detail::broadcast_like(reshape(t, kept, loc), reduce.inputs[0], loc);
}

std::vector<int64_t> inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t a = 0; a < perm.size(); ++a) inv[perm[a]] = int64_t(a);
  return inv;
}

// The mesh dims along which local op `n` takes `input` as differing per device although it is
// the same on each (JAX's implicit pbroadcast): elementwise ops and products take every input
// as varying wherever the result does, and the collectives that combine the devices' blocks
// take theirs as varying along their dim. local_chunk takes its input as it is (invariant).
uint64_t broadcast_dims(const Node& n, const Node& input) {
  if (n.op == OpKind::LocalChunk) return 0;
  if (is_functional_collective(n.op)) return (uint64_t(1) << n.attrs.axes[0]) & ~input.varying;
  return n.varying & ~input.varying;
}

// The values `n` is differentiated with respect to: its inputs, or its gradient rule's
// (dsl/gradient_rule.hpp), whose ops in between autodiff never enters.
const std::vector<NodeRef>& differentiated_inputs(const Node& n) {
  return n.attrs.gradient_rule ? n.attrs.gradient_rule->inputs : n.inputs;
}

std::string mesh_dim_name(const Node& n) { return n.mesh.dim_names()[size_t(n.attrs.axes[0])]; }

// local_map's ops (one input each). A collective's adjoint is its transpose over the stacked
// blocks of all devices; the adjoint of a value that is the same on every device of a dim
// arrives already summed over them (see the all_reduce in gradients()).
Tensor local_map_vjp(const NodeRef& node, const Tensor& g) {
  const Node& n = *node;
  const Loc loc = n.where;
  const Tensor in(n.inputs[0]), out(node);
  switch (n.op) {
    case OpKind::ToLocal: {
      const Layout& layout = *n.attrs.layout;
      for (size_t d = 0; d < layout.partial_ops().size(); ++d)
        if (layout.partial_ops()[d] && (g.node()->varying >> d & 1))
          throw LayoutError("gradient of local_map: the input made at " + n.location() + " is Partial over mesh dim '" +
                            n.mesh.dim_names()[d] + "' and its blocks' adjoints differ there, so no gradient of the "
                            "summed value exists; pass it Replicate or Shard");
      return detail::from_local_node(g, layout.without_partial(), n.inputs[0]->shape, loc);
    }
    case OpKind::FromLocal: return detail::to_local_node(g, n.attrs.layout->without_partial(), n.inputs[0]->shape, loc);
    case OpKind::AllReduce: {
      const std::string dim = mesh_dim_name(n);
      const int64_t ways = n.mesh.shape()[size_t(n.attrs.axes[0])];
      switch (ReduceOp(int(n.attrs.scalar))) {
        case ReduceOp::Sum: return g;
        case ReduceOp::Avg: return div(Operand(g, loc), Operand(double(ways), loc));
        case ReduceOp::Product: return div(Operand(mul(Operand(g, loc), Operand(out, loc)), loc), Operand(in, loc));
        case ReduceOp::Max: case ReduceOp::Min: {
          // Split equally among the devices that attain the extreme (as reduce_max does).
          Tensor hit = cast(in == Operand(out, loc), n.dtype, loc);
          Tensor count = all_reduce(hit, ReduceOp::Sum, dim, loc);
          return div(Operand(mul(Operand(g, loc), Operand(hit, loc)), loc), Operand(count, loc));
        }
      }
      break;
    }
    case OpKind::AllGather: return local_chunk(g, mesh_dim_name(n), n.attrs.axes[1], loc);
    case OpKind::ReduceScatter: {
      const ReduceOp op = ReduceOp(int(n.attrs.scalar));
      if (op != ReduceOp::Sum && op != ReduceOp::Avg)
        throw Error("gradient of reduce_scatter with " + std::string(reduce_op_name(op)) + " (at " + n.location() +
                    ") is not supported; use sum or avg");
      Tensor gathered = all_gather(g, mesh_dim_name(n), n.attrs.axes[1], loc);
      if (op == ReduceOp::Sum) return gathered;
      return div(Operand(gathered, loc), Operand(double(n.mesh.shape()[size_t(n.attrs.axes[0])]), loc));
    }
    case OpKind::AllToAll: return all_to_all(g, mesh_dim_name(n), n.attrs.axes[2], n.attrs.axes[1], loc);
    case OpKind::Shift: return permute(g, mesh_dim_name(n), inverse(detail::shift_destinations(n.attrs)), loc);
    case OpKind::LocalChunk: return all_gather(g, mesh_dim_name(n), n.attrs.axes[1], loc);
    default: break;
  }
  throw InternalError("local_map_vjp: " + std::string(op_name(n.op)));
}

// Vector-Jacobian products: the adjoint of each input of `n`, given the adjoint `g` of its output.
// Entries for non-differentiable inputs stay empty.
// `values`: the node whose inputs and result the rule reads: `node` itself, or for a
// checkpointed op its recomputed copy (the same op on recomputed inputs).
std::vector<std::optional<Tensor>> vjp(const NodeRef& node, const NodeRef& values, const Tensor& g) {
  const Node& n = *node;
  const Loc loc = n.where;
  const Tensor out(values);
  auto in = [&](size_t i) { return Tensor(values->inputs[i]); };
  std::vector<std::optional<Tensor>> d(n.inputs.size());
  switch (n.op) {
    case OpKind::Neg: d[0] = neg(g, loc); break;
    case OpKind::Abs: d[0] = where(in(0) < Operand(0.0, loc), neg(g, loc), where(in(0) > Operand(0.0, loc), g, 0.0, loc), loc); break;
    case OpKind::Exp: d[0] = mul(Operand(g, loc), Operand(out, loc)); break;
    case OpKind::Log: d[0] = div(Operand(g, loc), Operand(in(0), loc)); break;
    case OpKind::Sqrt: d[0] = div(Operand(g, loc), Operand(mul(Operand(out, loc), Operand(2.0, loc)), loc)); break;
    case OpKind::Tanh: d[0] = mul(Operand(g, loc), Operand(sub(Operand(1.0, loc), Operand(square(out, loc), loc)), loc)); break;
    case OpKind::Sin: d[0] = mul(Operand(g, loc), Operand(cos(in(0), loc), loc)); break;
    case OpKind::Cos: d[0] = neg(mul(Operand(g, loc), Operand(sin(in(0), loc), loc)), loc); break;
    case OpKind::Add: d[0] = g; d[1] = g; break;
    case OpKind::Sub: d[0] = g; d[1] = neg(g, loc); break;
    case OpKind::Mul:
      d[0] = mul(Operand(g, loc), Operand(in(1), loc));
      d[1] = mul(Operand(g, loc), Operand(in(0), loc));
      break;
    case OpKind::Div:
      d[0] = div(Operand(g, loc), Operand(in(1), loc));
      d[1] = neg(div(Operand(mul(Operand(g, loc), Operand(out, loc)), loc), Operand(in(1), loc)), loc);
      break;
    case OpKind::Maximum: case OpKind::Minimum: {
      // The winner takes the gradient; a tie goes to the first operand.
      Tensor first_wins = n.op == OpKind::Maximum ? (in(0) >= Operand(in(1), loc)) : (in(0) <= Operand(in(1), loc));
      d[0] = where(first_wins, g, 0.0, loc);
      d[1] = where(first_wins, 0.0, g, loc);
      break;
    }
    case OpKind::Pow:
      d[0] = mul(Operand(g, loc), Operand(mul(Operand(in(1), loc), Operand(pow(Operand(in(0), loc), Operand(sub(Operand(in(1), loc), Operand(1.0, loc)), loc)), loc)), loc));
      d[1] = mul(Operand(g, loc), Operand(mul(Operand(out, loc), Operand(log(in(0), loc), loc)), loc));
      break;
    case OpKind::Where:
      d[1] = where(in(0), g, 0.0, loc);
      d[2] = where(in(0), 0.0, g, loc);
      break;
    case OpKind::CheckIndex: case OpKind::StopGradient: break;  // integer indices; a value held constant
    case OpKind::ReducePartials: d[0] = g; break;
    case OpKind::Cast:
      if (is_floating(n.inputs[0]->dtype)) d[0] = cast(g, n.inputs[0]->dtype, loc);
      break;
    case OpKind::ReduceSum: d[0] = expand_back(g, n, loc); break;
    case OpKind::ReduceProd:
      d[0] = div(Operand(mul(Operand(expand_back(g, n, loc), loc), Operand(expand_back(out, n, loc), loc)), loc), Operand(in(0), loc));
      break;
    case OpKind::ReduceMax: case OpKind::ReduceMin: {
      // Split equally among the elements that attain the extreme (as TensorFlow does).
      Tensor hit = cast(in(0) == Operand(expand_back(out, n, loc), loc), n.dtype, loc);
      Tensor count = expand_back(reduce_sum(hit, n.attrs.axes, false, loc), n, loc);
      d[0] = div(Operand(mul(Operand(expand_back(g, n, loc), loc), Operand(hit, loc)), loc), Operand(count, loc));
      break;
    }
    case OpKind::Reshape: d[0] = reshape(g, n.inputs[0]->shape, loc); break;
    case OpKind::Permute: d[0] = transpose(g, inverse(n.attrs.axes), loc); break;
    case OpKind::Expand: d[0] = reshape(unbroadcast(g, n.inputs[0], loc), n.inputs[0]->shape, loc); break;
    case OpKind::Slice: {
      std::vector<std::pair<int64_t, int64_t>> pads;
      for (int64_t a = 0; a < n.rank(); ++a) pads.push_back({n.attrs.lo[a], n.inputs[0]->shape[a] - n.attrs.lo[a] - n.shape[a]});
      d[0] = pad(g, pads, 0.0, loc);
      break;
    }
    case OpKind::Pad: {
      std::vector<int64_t> size = n.inputs[0]->shape;
      d[0] = slice(g, n.attrs.lo, size, loc);
      break;
    }
    case OpKind::Concat: {
      const int64_t axis = n.attrs.axes[0];
      int64_t start = 0;
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        std::vector<int64_t> begin(n.rank(), 0), size = n.inputs[i]->shape;
        begin[axis] = start;
        d[i] = slice(g, begin, size, loc);
        start += size[axis];
      }
      break;
    }
    case OpKind::Dot:
      switch (dot_form(n.inputs[0]->rank(), n.inputs[1]->rank(), n.rank())) {
        case DotForm::Batched:
          d[0] = matmul(g, detail::transpose_last_two(in(1), loc), loc);
          d[1] = matmul(detail::transpose_last_two(in(0), loc), g, loc);
          break;
        case DotForm::Rows:  // out [..., n] = a [..., k] b [k, n]
          d[0] = matmul(g, detail::transpose_last_two(in(1), loc), loc);
          d[1] = detail::contract_rows(in(0), g, loc);
          break;
        case DotForm::ContractRows:  // out [k, n] = sum over rows of a [.., k]^T b [.., n]
          d[0] = matmul(in(1), detail::transpose_last_two(g, loc), loc);
          d[1] = matmul(in(0), g, loc);
          break;
      }
      break;
    case OpKind::TakeRows:
      // 16-bit rows (an embedding under mixed precision) are summed in f32: a character-level
      // model adds thousands of rows into each, far past bf16's 8 bits. Rounded once at the end.
      if (dtype_size(g.dtype()) < 4 && is_floating(g.dtype()))
        d[0] = cast(detail::scatter_add_rows(cast(g, DType::f32, loc), in(1), n.inputs[0]->shape[0], loc), g.dtype(), loc);
      else d[0] = detail::scatter_add_rows(g, in(1), n.inputs[0]->shape[0], loc);
      break;
    case OpKind::ScatterAddRows: d[0] = detail::take_rows(g, in(1), loc); break;
    case OpKind::GroupedDot:  // out_e = x_e w[e]: dx_e = dy_e w[e]^T, dw[e] = x_e^T dy_e; ends are integers
      d[0] = detail::grouped_dot(g, transpose(in(1), {0, 2, 1}, loc), in(2), loc);
      d[1] = detail::grouped_weight_grad(in(0), g, in(2), loc);
      break;
    case OpKind::GroupedWeightGrad:  // out[e] = x_e^T dy_e: dx_e = dy_e g[e]^T, d(dy)_e = x_e g[e]
      d[0] = detail::grouped_dot(in(1), transpose(g, {0, 2, 1}, loc), in(2), loc);
      d[1] = detail::grouped_dot(in(0), g, in(2), loc);
      break;
    case OpKind::Attention: {
      if (attention_attrs(n.attrs).part != AttentionPart::Forward)
        throw Error("gradient of the fused attention's backward (at " + n.location() +
                    ") is not supported; for second derivatives build the attention with SdpaKernel({SdpBackend::Math})");
      // The parts take the adjoint of the output and of the logsumexp column together (ring
      // attention merges blocks by their logsumexp; elsewhere its adjoint is zero).
      // Checkpointed, the parts read the recomputed operands, and the recomputed output unless
      // the policy keeps attention's (selective), which is then read as the forward left it.
      const NodeRef& output = n.checkpoint && n.checkpoint->recomputes(n) ? values : node;
      const auto [dq, dk, dv] = detail::flash_attention_vjp(output, values->inputs, g, loc);
      d[0] = dq;
      d[1] = dk;
      d[2] = dv;
      break;
    }
    case OpKind::WithLayout: {  // a relayout moves values, so its adjoint is the same values, wherever wanted
      if (!n.attrs.grad_dtype) {
        d[0] = n.attrs.grad_layout ? with_layout(g, *n.attrs.grad_layout, loc) : g;
        break;
      }
      // Relaid out (a partial sum reduced) in grad_dtype, then back in the input's dtype, except
      // into a cast from grad_dtype (mixed precision's parameter view), whose own gradient would
      // only widen it again after rounding it.
      Tensor moved = cast(g, *n.attrs.grad_dtype, loc);
      if (n.attrs.grad_layout) moved = with_layout(moved, *n.attrs.grad_layout, loc);
      const Node& in = *n.inputs[0];
      const bool into_widening_cast = in.op == OpKind::Cast && in.inputs[0]->dtype == *n.attrs.grad_dtype;
      d[0] = into_widening_cast ? moved : cast(moved, in.dtype, loc);
      break;
    }
    case OpKind::LayoutHint: d[0] = g; break;  // the partitioner places the adjoint
    case OpKind::MeshTransfer: {  // back to the source mesh, in the layout the value had there
      NodeAttrs attrs;
      attrs.layout = planned_layout(n.inputs[0]).without_partial();
      d[0] = Tensor(make_node(OpKind::MeshTransfer, g.dtype(), g.shape(), {g.node()}, std::move(attrs), loc));
      break;
    }
    case OpKind::ToLocal: case OpKind::FromLocal: case OpKind::AllReduce: case OpKind::AllGather:
    case OpKind::ReduceScatter: case OpKind::AllToAll: case OpKind::Shift: case OpKind::LocalChunk:
      d[0] = local_map_vjp(node, g);
      break;
    case OpKind::AllToAllV:  // the rows go back whence they came: the counts matrix transposed
      d[0] = detail::all_to_all_v_node(g, transpose(in(1), {1, 0}, loc), n.attrs.axes[0], n.inputs[0]->shape[0], loc);
      break;
    default: break;  // sources, comparisons, argmax: no gradient
  }
  return d;
}

}  // namespace

std::vector<Tensor> gradients(const Tensor& loss, const std::vector<Tensor>& wrt, const std::vector<std::optional<Layout>>& layouts) {
  if (!is_floating(loss.dtype()))
    throw DTypeError("grad: the loss must be floating, got " + std::string(dtype_name(loss.dtype())));
  std::unordered_set<const Node*> targets;
  for (const Tensor& w : wrt) targets.insert(w.node().get());
  // Nodes on a path from a target to the loss, in topological order. Nothing flows through a
  // stop_gradient, so what it reads is not searched: a pipeline's backward ticks each hold the
  // stop_gradient of everything before them, and searching it made tracing quadratic.
  std::unordered_map<const Node*, bool> reaches;
  std::vector<NodeRef> order;
  // Depth first, inputs before the node, with a stack of its own: a chain of dependent ops is
  // as long as the user makes it, and recursion overflowed the thread's stack.
  struct Visit {
    NodeRef node;
    std::vector<NodeRef> inputs;  // those it is differentiated through
    size_t next = 0;
    bool reaches = false;
  };
  std::vector<Visit> visiting;
  auto open = [&](const NodeRef& n) {
    Visit v{n, {}, 0, targets.count(n.get()) > 0};
    if ((!v.reaches || n->op != OpKind::Leaf) && n->op != OpKind::StopGradient) v.inputs = differentiated_inputs(*n);
    visiting.push_back(std::move(v));
  };
  open(loss.node());
  while (!visiting.empty()) {
    Visit& v = visiting.back();
    if (v.next < v.inputs.size()) {
      const NodeRef in = v.inputs[v.next++];
      if (auto it = reaches.find(in.get()); it != reaches.end()) v.reaches |= it->second;
      else open(in);
      continue;
    }
    const NodeRef n = std::move(v.node);
    const bool r = v.reaches;
    visiting.pop_back();
    reaches[n.get()] = r;
    if (r) order.push_back(n);
    if (!visiting.empty()) visiting.back().reaches |= r;
  }
  std::unordered_map<const Node*, Tensor> adjoint;
  adjoint.emplace(loss.node().get(), constant_like(loss.node(), 1.0));
  // Checkpointed values the backward computes again (dsl/checkpoint.hpp): an op of a region
  // reads copies of the region's own values, down to what the region keeps (its call's
  // arguments and what other regions built; under the selective policy its GEMMs and
  // collectives too), as torch.utils.checkpoint keeps each call's inputs.
  std::unordered_map<const Node*, NodeRef> copies;
  auto copy_of = [&](const NodeRef& n, std::vector<NodeRef> inputs) {
    NodeAttrs attrs = n->attrs;
    attrs.recomputed = true;
    const auto in_module = CommModuleScope::replacing(n->module);
    return make_node(n->op, n->dtype, n->shape, std::move(inputs), std::move(attrs), n->where);
  };
  std::function<NodeRef(const NodeRef&, const CheckpointRegion*)> recomputed = [&](const NodeRef& n, const CheckpointRegion* region) {
    if (n->checkpoint.get() != region || !region->recomputes(*n)) return n;
    if (auto it = copies.find(n.get()); it != copies.end()) return it->second;
    std::vector<NodeRef> inputs;
    for (const NodeRef& in : n->inputs) inputs.push_back(recomputed(in, region));
    return copies[n.get()] = copy_of(n, std::move(inputs));
  };
  // The node a rule reads `n`'s values from: itself, or a copy on recomputed inputs.
  auto values_of = [&](const NodeRef& n) -> NodeRef {
    const CheckpointRegion* region = n->checkpoint.get();
    if (!region) return n;
    if (region->recomputes(*n)) return recomputed(n, region);
    std::vector<NodeRef> inputs;
    bool changed = false;
    for (const NodeRef& in : n->inputs) {
      inputs.push_back(recomputed(in, region));
      changed |= inputs.back() != in;
    }
    // A kept op (a GEMM under the selective policy) on recomputed inputs: the rules of kept ops
    // read only their inputs, so the copy is never computed, only read through.
    return changed ? copy_of(n, std::move(inputs)) : n;
  };
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const NodeRef& n = *it;
    auto a = adjoint.find(n.get());
    if (a == adjoint.end() || !is_floating(n->dtype)) continue;
    if (targets.count(n.get()) && n->inputs.empty()) continue;
    // The gradient's ops belong to the module that built the op (CommDebugMode reports them there).
    const auto in_module = CommModuleScope::replacing(n->module);
    const std::vector<NodeRef>& inputs = differentiated_inputs(*n);
    std::vector<std::optional<Tensor>> d;
    if (const auto& rule = n->attrs.gradient_rule) {
      std::vector<NodeRef> input_values;
      for (const NodeRef& in : inputs) input_values.push_back(values_of(in));
      d = rule->vjp(values_of(n->inputs[0]), input_values, a->second);
    } else {
      d = vjp(n, values_of(n), a->second);
    }
    for (size_t i = 0; i < d.size(); ++i) {
      if (!d[i] || !reaches[inputs[i].get()] || !is_floating(inputs[i]->dtype)) continue;
      const Node* input = inputs[i].get();
      // A local value the same on every device of a mesh dim, used where values differ along it,
      // was in effect broadcast to them: its adjoint is the sum of theirs.
      const uint64_t summed = input->local ? broadcast_dims(*n, *input) : 0;
      for (size_t dim = 0; dim < 64; ++dim)
        if (summed >> dim & 1) d[i] = all_reduce(*d[i], ReduceOp::Sum, n->mesh.dim_names()[dim], n->where);
      auto existing = adjoint.find(input);
      if (existing == adjoint.end()) {
        adjoint.emplace(input, *d[i]);
        continue;
      }
      // Contributions in two dtypes (a gradient reduced in a mixed-precision reduce_dtype, and one
      // that was not) add in the wider one.
      Tensor& sum = existing->second;
      if (sum.dtype() != d[i]->dtype()) {
        const DType wider = dtype_size(sum.dtype()) >= dtype_size(d[i]->dtype()) ? sum.dtype() : d[i]->dtype();
        sum = cast(sum, wider, n->where);
        d[i] = cast(*d[i], wider, n->where);
      }
      sum = add(Operand(sum, n->where), Operand(*d[i], n->where));
    }
  }
  std::vector<Tensor> out;
  for (size_t i = 0; i < wrt.size(); ++i) {
    auto a = adjoint.find(wrt[i].node().get());
    Tensor g = a != adjoint.end() ? a->second : constant_like(wrt[i].node(), 0.0);
    // Where the gradient is handed out: the layout asked for, else the input's own (as PyTorch's
    // from_local backward does), Partials reduced.
    Layout wanted;
    if (i < layouts.size() && layouts[i]) wanted = *layouts[i];
    else if (auto value = wrt[i].node()->value()) wanted = value->layout.without_partial();
    if (!g.node()->mesh.is_valid()) {
      // A gradient that depends on no data (d/dx sum(3x) = 3) is a constant: it takes the input's
      // layout, since nothing else in it has one.
      g = with_layout(g, wanted.is_valid() ? wanted : wrt[i].layout().without_partial(), wrt[i].node()->where);
    } else if (wanted.is_valid()) {
      g = hand_out_gradient(g, wanted);
    }
    out.push_back(g);
  }
  return out;
}

Tensor hand_out_gradient(const Tensor& g, const Layout& wanted) {
  // Consumers inside a larger program (an optimizer) may take it in whatever layout is cheapest
  // (a sharded update receives it by reduce_scatter).
  NodeAttrs attrs;
  attrs.layout = wanted;
  return Tensor(make_node(OpKind::LayoutHint, g.dtype(), g.shape(), {g.node()}, attrs, g.node()->where));
}

Tensor gradient_as_computed(const Tensor& g) {
  if (g.node()->op != OpKind::LayoutHint) return g;
  return Tensor(g.node()->inputs[0]);
}

}  // namespace tessera
