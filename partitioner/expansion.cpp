#include "partitioner/expansion.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>

#include "dsl/element_count.hpp"
#include "dsl/error.hpp"
#include "dsl/local_map.hpp"
#include "dsl/shard_geometry.hpp"
#include "partitioner/redistribute_plan.hpp"

namespace tessera {
namespace {

// A node wanted in a layout: the memo key of materialise and available_without_communication.
struct NodeLayoutKey {
  const Node* node;
  Layout layout;
  bool operator==(const NodeLayoutKey&) const = default;
};
struct NodeLayoutKeyHash {
  size_t operator()(const NodeLayoutKey& key) const {
    return size_t(hash_mix(uint64_t(reinterpret_cast<uintptr_t>(key.node)), hash_value(key.layout)));
  }
};

class Expansion {
 public:
  explicit Expansion(ShardingPropagation& propagation) : propagation_(propagation), mesh_(propagation.mesh()) {}

  LocalProgram expand(const PartitionRequest& request) {
    program_.mesh = mesh_;
    program_.target = propagation_.target();
    // Outputs are visited last first: a training step's later parameters' gradients come first
    // in its backward, so each block's activations die with its gradients rather than living
    // until the last output is reached (depth-first order emits values at first use).
    program_.outputs.resize(request.outputs.size());
    for (size_t i = request.outputs.size(); i-- > 0;) {
      const NodeRef& out = request.outputs[i];
      Layout want;
      if (i < request.output_layouts.size() && request.output_layouts[i]) want = *request.output_layouts[i];
      else want = propagation_.user_layout(out);
      program_.outputs[i] = materialise(out, want);
    }
    assign_symbolic_dims();
    return std::move(program_);
  }

 private:
  const NodeInfo& info(const Node* n) const { return propagation_.info(n); }
  int64_t cost(const Node& value, const Layout& from, const Layout& to) { return propagation_.cost(value, from, to); }

  // Whether `n` can be had in layout `want` with no communication at all.
  bool available_without_communication(const Node* n, const Layout& want) {
    const NodeInfo& ni = info(n);
    if (ni.natural == want) return true;
    if (ni.is_input) return false;
    if (is_generated_source(n->op)) return true;
    if (!is_cheap(n->op)) return false;
    NodeLayoutKey key{n, want};
    if (auto it = available_.find(key); it != available_.end()) return it->second;
    bool ok = false;
    if (auto ins = layouts_producing(*n, want)) {
      ok = true;
      for (size_t i = 0; ok && i < ins->size(); ++i) ok = available_without_communication(n->inputs[i].get(), (*ins)[i]);
    }
    available_[std::move(key)] = ok;
    return ok;
  }

  // `requested_by`: the with_layout that asked for `want`; its redistribute steps are reported
  // (explain, CommDebugMode) at the user's redistribute line, not where the value was made.
  int materialise(const NodeRef& n, const Layout& want, const NodeRef& requested_by = nullptr) {
    const NodeLayoutKey key{n.get(), want};
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    if (n->local) {
      int id = emit_local(n);
      memo_[key] = id;
      return id;
    }
    const NodeInfo& ni = info(n.get());
    // A with_layout fixes the layout of the value where it is looked at; a consumer that wants it
    // in another layout gets it straight from the input (a partial sum wanted sharded is then one
    // reduce_scatter, not an all_reduce followed by a chunk).
    if ((n->op == OpKind::WithLayout || n->op == OpKind::LayoutHint) && !ni.is_input) {
      // Only the user's with_layout: a gradient's layout hint is reported at the op it hints.
      const bool asks = !requested_by && n->op == OpKind::WithLayout;
      // A recomputed copy (a checkpointed block's gathered parameter, dsl/checkpoint.hpp) moves
      // its input again where the backward wants it: sharing the forward's result would keep it
      // from the forward to the backward (FSDP's reshard after forward).
      const NodeRef& in = n->inputs[0];
      const NodeInfo& in_info = info(in.get());
      const Layout in_natural = in_info.free ? Layout::replicated(mesh_, in->rank()) : in_info.natural;
      if (n->attrs.recomputed && !in_info.free && !(in_natural == want)) {
        const int id = redistribute(in, materialise(in, in_natural), in_natural, want, requested_by ? requested_by : n);
        memo_[key] = id;
        return id;
      }
      int id = materialise(n->inputs[0], want, asks ? n : requested_by);
      memo_[key] = id;
      return id;
    }
    int id;
    if (ni.natural == want && !ni.free) {
      id = emit(n, want, ni.required_inputs);
    } else if (!ni.is_input && (is_generated_source(n->op) || is_cheap(n->op)) && available_without_communication(n.get(), want)) {
      id = emit(n, want, is_generated_source(n->op) ? std::vector<Layout>{} : *layouts_producing(*n, want));
    } else if (auto moved = movement_on_moved_input(n, want)) {
      id = emit(n, want, *moved);
    } else if (auto pushed = elementwise_on_moved_inputs(n, want)) {
      id = emit(n, want, *pushed);
    } else if (want.has_partial() && !ni.is_input && (is_generated_source(n->op) || is_cheap(n->op)) &&
               available_without_communication(n.get(), want.without_partial())) {
      // A cheap value wanted as partial terms (a bias added to a pending sum): made in the
      // wanted shards and split into terms locally, never materialised whole and then chunked.
      id = redistribute(n, materialise(n, want.without_partial()), want.without_partial(), want, requested_by ? requested_by : n);
    } else {
      const Layout natural = ni.free ? Layout::replicated(mesh_, n->rank()) : ni.natural;
      int base = materialise(n, natural);
      id = redistribute(n, base, natural, want, requested_by ? requested_by : n);
    }
    memo_[key] = id;
    return id;
  }

  // A movement op (a transpose feeding a GEMM, say) wanted in another layout: moving its input
  // instead costs the same bytes and spares materialising the op's result just to send it.
  // Returns the input layout to use, when that is no dearer.
  std::optional<std::vector<Layout>> movement_on_moved_input(const NodeRef& n, const Layout& want) {
    const NodeInfo& ni = info(n.get());
    if (ni.is_input || ni.free || !is_movement(n->op) || n->inputs.size() != 1) return std::nullopt;
    auto ins = layouts_producing(*n, want);
    if (!ins) return std::nullopt;
    const NodeInfo& in = info(n->inputs[0].get());
    const Layout in_natural = in.free ? Layout::replicated(mesh_, n->inputs[0]->rank()) : in.natural;
    if (cost(*n->inputs[0], in_natural, (*ins)[0]) > cost(*n, ni.natural, want)) return std::nullopt;
    return ins;
  }

  // An elementwise op wanted in another layout: computing it there from its inputs moved
  // instead can cost less than computing it in its natural layout and moving the result. A
  // pending sum plus a bias, wanted as row shards (sequence parallelism), is then one
  // reduce_scatter and a bias chunk, not an all_reduce, a whole add and a local chunk.
  std::optional<std::vector<Layout>> elementwise_on_moved_inputs(const NodeRef& n, const Layout& want) {
    const NodeInfo& ni = info(n.get());
    if (ni.is_input || ni.free || !is_elementwise(n->op) || ni.required_inputs.size() != n->inputs.size()) return std::nullopt;
    auto ins = layouts_producing(*n, want);
    if (!ins) return std::nullopt;
    int64_t in_natural = cost(*n, ni.natural, want), in_wanted = 0;
    for (size_t i = 0; i < n->inputs.size(); ++i) {
      const Node& in = *n->inputs[i];
      const NodeInfo& ii = info(&in);
      const Layout from = ii.free ? Layout::replicated(mesh_, in.rank()) : ii.natural;
      // A 16-bit partial sum widened by a cast (mixed precision's gradients, cast to reduce_dtype)
      // is summed in the wider dtype: reducing it before the cast, though fewer bytes, would sum
      // in bf16's 8 bits. (f32 sums widened to f64, as layer_norm's statistics are, keep the
      // cheaper f32 reduction: its error is already below the result's rounding.)
      if (is_floating(in.dtype) && dtype_size(in.dtype) == 2 && dtype_size(n->dtype) > 2 && from.has_partial() &&
          !(*ins)[i].has_partial())
        return std::nullopt;
      in_natural += cost(in, from, ni.required_inputs[i]);
      in_wanted += cost(in, from, (*ins)[i]);
    }
    if (in_wanted >= in_natural) return std::nullopt;
    return ins;
  }

  int emit(const NodeRef& n, const Layout& layout, const std::vector<Layout>& input_layouts) {
    if (n->op == OpKind::WithLayout && !info(n.get()).is_input)
      return materialise(n->inputs[0], layout, n);  // a constraint, not a computation
    // A computed value is an input whatever op made it: its storage is what it is, and the
    // executable cache keys it by dtype, shape and layout alone (jit/driver.cpp).
    if (is_generated_source(n->op) && layout.has_partial() && !info(n.get()).is_input) {
      // Generate the value, then split it into partial terms locally (coordinate 0 keeps it).
      int id = emit(n, layout.without_partial(), {});
      return redistribute(n, id, layout.without_partial(), layout, n);
    }
    LocalNode node;
    node.dtype = n->dtype;
    node.global_shape = n->shape;
    node.layout = layout;
    node.origin = NodeOrigin(n);
    if (info(n.get()).is_input) {
      if (!n->value())
        throw LayoutError("the redistribute between meshes at " + n->location() +
                          " cannot be traced into a compiled step (a program runs on one mesh); force it before the step");
      node.kind = LocalNode::Kind::Input;
      node.input_index = int(program_.inputs.size());
      program_.inputs.push_back(n);
    } else {
      node.kind = LocalNode::Kind::Compute;
      node.op = n->op == OpKind::FromLocal ? OpKind::Reshape : n->op;  // the same blocks, seen globally
      node.attrs = n->attrs;
      for (size_t i = 0; i < n->inputs.size(); ++i) node.inputs.push_back(materialise(n->inputs[i], input_layouts[i]));
    }
    program_.nodes.push_back(std::move(node));
    return int(program_.nodes.size()) - 1;
  }

  // A local value of local_map: every device computes it on its blocks. to_local is its input's
  // block (same extents); a functional collective is one redistribute step of a global value
  // that the local blocks make up (a gather of blocks along an axis, a reduce of partial
  // terms), so the executor, explain() and CommDebugMode treat it like any other.
  int emit_local(const NodeRef& n) {
    LocalNode node;
    node.dtype = n->dtype;
    node.origin = NodeOrigin(n);
    if (is_functional_collective(n->op)) {
      node.kind = LocalNode::Kind::Redistribute;
      for (const auto& in : n->inputs)  // all_to_all_v reads its counts matrix too
        node.inputs.push_back(collective_buffer(materialise(in, Layout::replicated(mesh_, in->rank()))));
      node.step = collective_step(*n, node.global_shape);
      node.layout = node.step.after;
      program_.nodes.push_back(std::move(node));
      return own_blocks_view(n, int(program_.nodes.size()) - 1);
    }
    node.kind = LocalNode::Kind::Compute;
    node.op = n->op == OpKind::ToLocal ? OpKind::Reshape : n->op;
    node.attrs = n->attrs;
    // Blocks of uneven extents are blocks of a virtual global value (dsl/block_extents.hpp).
    const BlockExtents extents = extents_of(*n, mesh_);
    node.global_shape = extents_global_shape(extents);
    node.layout = extents_layout(extents);
    for (const auto& in : n->inputs)
      node.inputs.push_back(materialise(in, n->op == OpKind::ToLocal ? *n->attrs.layout : Layout::replicated(mesh_, in->rank())));
    program_.nodes.push_back(std::move(node));
    return int(program_.nodes.size()) - 1;
  }

  // Local ops are lowered against their inputs' virtual global values (a reshape pairs axes
  // by global extents), each derived from block extents. A collective's step moves another
  // virtual value (all_to_all, reduce_scatter, local_chunk: its blocks cut from the value
  // before the split), so local ops read its result through a view of the same blocks as
  // the value its extents describe; collectives read the buffer itself (no copy).
  int own_blocks_view(const NodeRef& n, int step_id) {
    const BlockExtents own = extents_of(*n, mesh_);
    const LocalNode& step = program_.nodes[size_t(step_id)];
    if (step.global_shape == extents_global_shape(own) && step.layout == extents_layout(own)) return step_id;
    LocalNode view;
    view.kind = LocalNode::Kind::Compute;
    view.op = OpKind::Reshape;  // the same block extents: the same elements
    view.dtype = n->dtype;
    view.origin = NodeOrigin(n);
    view.global_shape = extents_global_shape(own);
    view.layout = extents_layout(own);
    view.inputs = {step_id};
    program_.nodes.push_back(std::move(view));
    const int id = int(program_.nodes.size()) - 1;
    collective_buffers_[id] = step_id;
    return id;
  }
  int collective_buffer(int id) const {
    auto it = collective_buffers_.find(id);
    return it == collective_buffers_.end() ? id : it->second;
  }

  // The step of functional collective `n`, and (in `shape`) the virtual global value it moves:
  // the local blocks before and after are its blocks in step.before and step.after. Axes that
  // the collective does not touch keep their extents (uneven ones are split over other dims).
  RedistributeStep collective_step(const Node& n, std::vector<int64_t>& shape) {
    const int64_t d = n.attrs.axes[0], ways = mesh_.shape()[size_t(d)];
    const BlockExtents in = extents_of(*n.inputs[0], mesh_), out = extents_of(n, mesh_);
    // `e` with axis `axis` split once more over d, as the collective's blocks are cut.
    auto split_over_d = [&](BlockExtents e, int64_t axis) {
      e.axes[size_t(axis)].dims.push_back(d);
      return e;
    };
    auto partial = [&](const BlockExtents& e, ReduceOp op) {
      std::vector<std::optional<ReduceOp>> ops(size_t(mesh_.ndim()));
      ops[size_t(d)] = op;
      return Layout(mesh_, extents_layout(e).axis_mesh_dims(), ops);
    };
    const ReduceOp op = ReduceOp(int(n.attrs.scalar));
    RedistributeStep step{redistribute_kind_of(n.op), d, extents_layout(in), extents_layout(in)};
    shape = extents_global_shape(in);
    switch (n.op) {
      case OpKind::AllReduce: step.before = partial(in, op); step.op = op; break;
      case OpKind::AllGather: {
        const BlockExtents before = split_over_d(out, n.attrs.axes[1]);
        step.before = extents_layout(before);
        step.after = extents_layout(out);
        shape = extents_global_shape(out);
        break;
      }
      case OpKind::ReduceScatter:
        step.before = partial(in, op);
        step.after = extents_layout(split_over_d(in, n.attrs.axes[1]));
        step.op = op;
        break;
      case OpKind::AllToAll: {
        const int64_t split = n.attrs.axes[1], concat = n.attrs.axes[2];
        BlockExtents whole = in;  // the split axis as it comes in, the concat axis as it leaves
        whole.axes[size_t(concat)] = out.axes[size_t(concat)];
        step.before = extents_layout(split_over_d(whole, concat));
        step.after = extents_layout(split_over_d(whole, split));
        shape = extents_global_shape(whole);
        break;
      }
      case OpKind::Shift:
        step.destinations = detail::shift_destinations(n.attrs);
        break;
      case OpKind::LocalChunk:
        step.after = extents_layout(split_over_d(in, n.attrs.axes[1]));
        break;
      case OpKind::AllToAllV:  // sizes known when it runs: planned as its bound, the rows out
        step.before = step.after = extents_layout(out);
        shape = extents_global_shape(out);
        break;
      default: throw InternalError(std::string("collective_step: ") + std::string(op_name(n.op)) + " is no collective");
    }
    step.estimated_bytes = element_count(shape) * dtype_size(n.dtype) * mesh_.size() / ways;
    return step;
  }

  int redistribute(const NodeRef& n, int id, const Layout& from, const Layout& to, const NodeRef& origin) {
    for (const RedistributeStep& step : plan_redistribute(n->shape, n->dtype, from, to)) {
      LocalNode node;
      node.kind = LocalNode::Kind::Redistribute;
      node.dtype = n->dtype;
      node.global_shape = n->shape;
      node.layout = step.after;
      node.origin = NodeOrigin(origin);
      node.step = step;
      node.inputs = {id};
      program_.nodes.push_back(std::move(node));
      id = int(program_.nodes.size()) - 1;
    }
    return id;
  }

  // The devices an abstract mesh's program is planned for. torch.chunk gives earlier shards at
  // least the rows of later ones, and a device holds a partial term's identity buffer only off
  // coordinate 0, so a device whose coordinates are all 0 or 1 holds at least what any device
  // with coordinates at least as large does: the most loaded device is among these (at most
  // 2^ndim of them, whatever the mesh's size).
  std::vector<int64_t> abstract_planned_devices() const {
    const std::vector<int64_t> shape = mesh_.shape(), strides = mesh_.strides();
    std::vector<int64_t> ids = {0};
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] > 1)
        for (size_t i = 0, n = ids.size(); i < n; ++i) ids.push_back(ids[i] + strides[d]);
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  // Local extents and offsets per device: constants where all devices agree, else parameters;
  // random ops' seeds are always parameters (LocalNode::seed_param).
  void assign_symbolic_dims() {
    const std::vector<int64_t> ids = mesh_.is_abstract() ? abstract_planned_devices() : mesh_.local_device_ids();
    program_.device_ids = ids;
    std::vector<std::vector<int64_t>> coords;
    for (int64_t id : ids) coords.push_back(mesh_.coords(id));
    program_.device_params.assign(ids.size(), {});
    std::map<std::vector<int64_t>, int> slots;  // identical per-device value lists share a slot
    auto slot = [&](const std::vector<int64_t>& per_device) {
      auto [it, inserted] = slots.try_emplace(per_device, program_.num_params);
      if (inserted) {
        ++program_.num_params;
        for (size_t d = 0; d < per_device.size(); ++d) program_.device_params[d].push_back(per_device[d]);
      }
      return it->second;
    };
    auto symbolic = [&](const std::vector<int64_t>& per_device) {
      bool same = true;
      for (int64_t v : per_device) same &= v == per_device.front();
      if (same) return SymbolicDim{per_device.front(), -1};
      return SymbolicDim{0, slot(per_device)};
    };
    for (LocalNode& node : program_.nodes) {
      if (node.kind == LocalNode::Kind::Compute && (node.op == OpKind::RandomUniform || node.op == OpKind::RandomNormal))
        node.seed_param = slot(std::vector<int64_t>(ids.size(), int64_t(node.attrs.seed)));
      std::vector<ShardBox> boxes;
      for (const auto& c : coords) boxes.push_back(shard_geometry(node.global_shape, node.layout, c));
      for (int64_t a = 0; a < node.rank(); ++a) {
        std::vector<int64_t> extents, offsets;
        for (const auto& b : boxes) {
          extents.push_back(b.local_shape[a]);
          offsets.push_back(b.global_offset[a]);
        }
        node.local_shape.push_back(symbolic(extents));
        node.local_offset.push_back(symbolic(offsets));
      }
    }
  }

  ShardingPropagation& propagation_;
  const Mesh mesh_;
  std::unordered_map<NodeLayoutKey, int, NodeLayoutKeyHash> memo_;
  std::unordered_map<NodeLayoutKey, bool, NodeLayoutKeyHash> available_;
  LocalProgram program_;
  std::unordered_map<int, int> collective_buffers_;  // own_blocks_view's view -> the step's result
};

}  // namespace

LocalProgram expand(ShardingPropagation& propagation, const PartitionRequest& request) {
  return Expansion(propagation).expand(request);
}

}  // namespace tessera
