#include "partitioner/spmd_expansion.hpp"

#include <functional>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "dsl/error.hpp"
#include "dsl/shard_geometry.hpp"
#include "dsl/string_util.hpp"
#include "partitioner/cost_model.hpp"
#include "partitioner/sharding_rules.hpp"

namespace tessera {
namespace {

bool is_source(OpKind op) { return op_category(op) == OpCategory::Source && op != OpKind::Leaf; }
bool is_cheap(OpKind op) {
  return (is_elementwise(op) && !is_expensive(op)) || (is_movement(op));
}

struct NodeInfo {
  Layout natural;
  bool free = false;
  bool is_input = false;
  std::vector<Layout> required_inputs;  // the rule's input layouts for the natural layout
};

class Partitioner {
 public:
  Partitioner(const std::vector<NodeRef>& outputs, bool deterministic) {
    for (const auto& out : outputs)
      if (out->mesh.is_valid()) {
        mesh_ = out->mesh;
        break;
      }
    if (!mesh_.is_valid())
      throw LayoutError("cannot place a computation that has no mesh: give one of its sources a layout");
    target_ = Target{mesh_.device_kind(), deterministic};
    for (const auto& out : outputs)
      if (out->local)
        throw LayoutError("a local value of local_map (made at " + out->location() +
                          ") has no global value or layout of its own: return it from the local_map'ed function");
    for (const auto& out : outputs) {
      visit(out);
      requested_.insert(out.get());
    }
    for (const Node* n : order_) propagate(*n);
    for (auto choose : {&Partitioner::choose_gathered_contractions, &Partitioner::choose_weight_stationary_dots})
      if ((this->*choose)()) {
        info_.clear();
        for (const Node* n : order_) propagate(*n);
      }
  }

  const NodeInfo& info(const Node* n) const { return info_.at(n); }

  // The layout a value is handed to the user in: the one its op gives it, Partial included, as
  // PyTorch's DTensor leaves a sum of partial terms unreduced until it is asked for
  // (full_tensor, redistribute): looking at a value runs no collective the reference would not.
  Layout user_layout(const NodeRef& n) const {
    if (n->op == OpKind::LayoutHint && !info(n.get()).is_input) return *n->attrs.layout;
    return info(n.get()).natural;
  }

  LocalProgram expand(const PartitionRequest& request) {
    program_.mesh = mesh_;
    program_.target = target_;
    for (size_t i = 0; i < request.outputs.size(); ++i) {
      const NodeRef& out = request.outputs[i];
      Layout want;
      if (i < request.output_layouts.size() && request.output_layouts[i]) want = *request.output_layouts[i];
      else want = user_layout(out);
      program_.outputs.push_back(materialise(out, want));
    }
    assign_symbolic_dims();
    return std::move(program_);
  }

 private:
  // Post-order over the pending part of the graph; computed values stop the walk.
  void visit(const NodeRef& n) {
    if (!seen_.insert(n.get()).second) return;
    if (!n->value() && n->op != OpKind::MeshTransfer)  // a transfer's input lives on another mesh
      for (const auto& in : n->inputs) visit(in);
    order_.push_back(n.get());
  }

  int64_t cost(const Node& value, const Layout& from, const Layout& to) {
    if (from == to) return 0;
    std::string key = std::to_string(value.hash) + "|" + from.to_string() + "|" + to.to_string();
    auto it = cost_cache_.find(key);
    if (it != cost_cache_.end()) return it->second;
    int64_t c = plan_cost(plan_redistribute(value.shape, value.dtype, from, to));
    cost_cache_[key] = c;
    return c;
  }

  // The layouts the consumers of `n` require of it, looking through layout hints (which are
  // transparent); nullopt when a consumer takes it as is (a program output).
  std::optional<std::vector<Layout>> required_of(const Node* n,
                                                 const std::unordered_map<const Node*, std::vector<const Node*>>& consumers) {
    if (requested_.count(n)) return std::nullopt;
    std::vector<Layout> out;
    auto it = consumers.find(n);
    if (it == consumers.end()) return out;
    for (const Node* c : it->second) {
      if (c->op == OpKind::LayoutHint) {
        auto more = required_of(c, consumers);
        if (!more) return std::nullopt;
        out.insert(out.end(), more->begin(), more->end());
        continue;
      }
      const NodeInfo& ci = info(c);
      for (size_t i = 0; i < c->inputs.size(); ++i)
        if (c->inputs[i].get() == n) {
          if (i >= ci.required_inputs.size()) return std::nullopt;
          out.push_back(ci.required_inputs[i]);
        }
    }
    return out;
  }

  // A dot whose partial sum every consumer wants sharded (a reduce_scatter) may be cheaper to
  // compute in that layout directly from moved operands. Records such choices and says whether
  // there were any (propagation then runs again, downstream of the new layouts).
  bool choose_gathered_contractions() {
    const auto consumers = consumers_of_pending();
    bool any = false;
    for (const Node* n : order_) {
      const NodeInfo& ni = info(n);
      if (n->op != OpKind::Dot || n->local || ni.is_input || ni.free || !ni.natural.has_partial()) continue;
      const auto target_or = agreed_unreduced_target(n, consumers);
      if (!target_or) continue;
      const Layout& target = *target_or;
      const ShardingDecision direct = dot_producing(*n, target);
      int64_t now = cost(*n, ni.natural, target), gathered = 0;
      for (size_t i = 0; i < 2; ++i) {
        const NodeInfo& in = info(n->inputs[i].get());
        if (in.free) continue;
        now += cost(*n->inputs[i], in.natural, ni.required_inputs[i]);
        gathered += cost(*n->inputs[i], in.natural, direct.inputs[i]);
      }
      if (gathered < now) any |= chosen_.emplace(n, direct).second;
    }
    return any;
  }

  // A dot of a row-sharded activation and a replicated operand (a weight) reads the whole weight
  // on every device, and with few rows per device that read, not the arithmetic, sets its speed.
  // Sharding the contraction instead reads only the device's rows of the weight (a local chunk),
  // for moving the activation (free when another consumer moves it so anyway, as the gathered
  // weight gradient does) and reducing the partial product into the layout its consumers want.
  bool choose_weight_stationary_dots() {
    const auto consumers = consumers_of_pending();
    bool any = false;
    for (const Node* n : order_) {
      const NodeInfo& ni = info(n);
      if (n->op != OpKind::Dot || n->local || n->rank() != 2 || chosen_.count(n) || ni.is_input || ni.free ||
          avoid_partial_sum(n->dtype, target_) || ni.natural.has_partial())
        continue;
      const Node *a = n->inputs[0].get(), *b = n->inputs[1].get();
      if (info(b).free || !info(b).natural.is_fully_replicated() || !ni.required_inputs[1].is_fully_replicated()) continue;
      const Layout& a_now = ni.required_inputs[0];
      const auto& rows = a_now.axis_mesh_dims()[0];
      if (a_now.has_partial() || rows.size() != 1 || !a_now.axis_mesh_dims()[1].empty()) continue;
      const int64_t d = rows[0];
      const auto target_or = agreed_unreduced_target(n, consumers);
      if (!target_or) continue;
      const Layout& target = *target_or;
      std::vector<std::optional<ReduceOp>> partial(size_t(mesh_.ndim()));
      partial[size_t(d)] = ReduceOp::Sum;
      const ShardingDecision split{Layout(mesh_, {{}, {}}, partial),
                                   {Layout(mesh_, {{}, {d}}), Layout(mesh_, {{d}, {}})}};
      const Layout a_natural = info(a).natural;
      const bool a_moved_anyway = moved_layouts(a, n, consumers).count(split.inputs[0].to_string()) > 0;
      const int64_t now = cost(*n, ni.natural, target) + cost(*a, a_natural, a_now);
      const int64_t alternative = cost(*n, split.output, target) + (a_moved_anyway ? 0 : cost(*a, a_natural, split.inputs[0]));
      const int64_t ways = mesh_.shape()[size_t(d)];
      // Summed over the mesh, as communication costs are.
      const int64_t weight_bytes_spared = b->numel() * dtype_size(b->dtype) * (ways - 1) / ways * mesh_.size();
      if (alternative < now + weight_bytes_spared / kLocalBytesPerCommunicatedByte) any |= chosen_.emplace(n, split).second;
    }
    return any;
  }

  // The one layout, without Partial, that every consumer of `n` requires; nullopt otherwise.
  std::optional<Layout> agreed_unreduced_target(const Node* n,
                                                const std::unordered_map<const Node*, std::vector<const Node*>>& consumers) {
    const auto wanted = required_of(n, consumers);
    if (!wanted || wanted->empty() || wanted->front().has_partial()) return std::nullopt;
    for (const Layout& w : *wanted)
      if (w != wanted->front()) return std::nullopt;
    return wanted->front();
  }

  std::unordered_map<const Node*, std::vector<const Node*>> consumers_of_pending() const {
    std::unordered_map<const Node*, std::vector<const Node*>> consumers;
    for (const Node* n : order_)
      if (!n->value())
        for (const auto& in : n->inputs) consumers[in.get()].push_back(n);
    return consumers;
  }

  // The layouts (as text) that consumers of `value` other than `except` will materialise it in:
  // what they require, also through the movement ops (transposes) that move their input instead.
  std::unordered_set<std::string> moved_layouts(const Node* value, const Node* except,
                                                const std::unordered_map<const Node*, std::vector<const Node*>>& consumers) {
    std::unordered_set<std::string> out;
    auto it = consumers.find(value);
    if (it == consumers.end()) return out;
    for (const Node* c : it->second) {
      if (c == except) continue;
      const NodeInfo& ci = info(c);
      for (size_t i = 0; i < c->inputs.size() && i < ci.required_inputs.size(); ++i)
        if (c->inputs[i].get() == value) out.insert(ci.required_inputs[i].to_string());
      if (!is_movement(c->op) || c->inputs.size() != 1) continue;
      if (auto wanted = required_of(c, consumers))
        for (const Layout& w : *wanted)
          if (auto ins = layouts_producing(*c, w)) out.insert((*ins)[0].to_string());
    }
    return out;
  }

  void propagate(const Node& n) {
    NodeInfo& ni = info_[&n];
    if (auto chosen = chosen_.find(&n); chosen != chosen_.end()) {
      ni.natural = chosen->second.output;
      ni.required_inputs = chosen->second.inputs;
      return;
    }
    if (auto value = n.value()) {
      if (!(value->layout.mesh() == mesh_))
        throw LayoutError(std::string(op_name(n.op)) + " at " + n.location() + " lives on mesh " +
                          value->layout.mesh().to_string() + " but the computation runs on " + mesh_.to_string() +
                          " (mismatched meshes)");
      ni.natural = value->layout;
      ni.is_input = true;
      return;
    }
    if (n.op == OpKind::MeshTransfer) {  // computed ahead of the program (jit/mesh_transfer.hpp)
      ni.natural = *n.attrs.layout;
      ni.is_input = true;
      return;
    }
    if (n.local || n.op == OpKind::FromLocal) {
      // local_map: a local value is computed as it is on every device (its blocks are its
      // whole value there); to_local takes its input in the given layout, and from_local's
      // value is in the given layout.
      ni.natural = n.op == OpKind::FromLocal ? *n.attrs.layout : Layout::replicated(mesh_, n.rank());
      ni.required_inputs.clear();
      for (const auto& in : n.inputs)
        ni.required_inputs.push_back(n.op == OpKind::ToLocal ? *n.attrs.layout : Layout::replicated(mesh_, in->rank()));
      return;
    }
    if (is_source(n.op)) {
      ni.free = !n.attrs.layout.has_value();
      ni.natural = ni.free ? Layout::replicated(mesh_, n.rank()) : *n.attrs.layout;
      return;
    }
    if (n.op == OpKind::LayoutHint) {  // transparent inside the program
      ni = info_.at(n.inputs[0].get());
      ni.is_input = false;
      ni.required_inputs = {ni.natural};
      return;
    }
    std::vector<Layout> ins;
    std::vector<bool> free;
    bool all_free = true;
    for (const auto& in : n.inputs) {
      const NodeInfo& ii = info_.at(in.get());
      ins.push_back(ii.natural);
      free.push_back(ii.free);
      all_free &= ii.free;
    }
    if (all_free && is_cheap(n.op)) {
      ni.free = true;
      ni.natural = Layout::replicated(mesh_, n.rank());
      return;
    }
    ShardingDecision d = decide_sharding(
        n, ins, free, [this](const Node& v, const Layout& a, const Layout& b) { return cost(v, a, b); }, target_);
    ni.natural = d.output;
    ni.required_inputs = std::move(d.inputs);
  }

  // Whether `n` can be had in layout `want` with no communication at all.
  bool available_without_communication(const Node* n, const Layout& want) {
    const NodeInfo& ni = info(n);
    if (ni.natural == want) return true;
    if (ni.is_input) return false;
    if (is_source(n->op)) return true;
    if (!is_cheap(n->op)) return false;
    std::string key = std::to_string(reinterpret_cast<uintptr_t>(n)) + "|" + want.to_string();
    if (auto it = available_.find(key); it != available_.end()) return it->second;
    bool ok = false;
    if (auto ins = layouts_producing(*n, want)) {
      ok = true;
      for (size_t i = 0; ok && i < ins->size(); ++i) ok = available_without_communication(n->inputs[i].get(), (*ins)[i]);
    }
    available_[key] = ok;
    return ok;
  }

  // `requested_by`: the with_layout that asked for `want`; its redistribute steps are reported
  // (explain, CommDebugMode) at the user's redistribute line, not where the value was made.
  int materialise(const NodeRef& n, const Layout& want, const NodeRef& requested_by = nullptr) {
    std::string key = std::to_string(reinterpret_cast<uintptr_t>(n.get())) + "|" + want.to_string();
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
      int id = materialise(n->inputs[0], want, asks ? n : requested_by);
      memo_[key] = id;
      return id;
    }
    int id;
    if (ni.natural == want && !ni.free) {
      id = emit(n, want, ni.required_inputs);
    } else if (!ni.is_input && (is_source(n->op) || is_cheap(n->op)) && available_without_communication(n.get(), want)) {
      id = emit(n, want, is_source(n->op) ? std::vector<Layout>{} : *layouts_producing(*n, want));
    } else if (auto moved = movement_on_moved_input(n, want)) {
      id = emit(n, want, *moved);
    } else if (auto pushed = elementwise_on_moved_inputs(n, want)) {
      id = emit(n, want, *pushed);
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
      in_natural += cost(in, from, ni.required_inputs[i]);
      in_wanted += cost(in, from, (*ins)[i]);
    }
    if (in_wanted >= in_natural) return std::nullopt;
    return ins;
  }

  int emit(const NodeRef& n, const Layout& layout, const std::vector<Layout>& input_layouts) {
    if (n->op == OpKind::WithLayout && !info(n.get()).is_input)
      return materialise(n->inputs[0], layout, n);  // a constraint, not a computation
    if (is_source(n->op) && layout.has_partial()) {
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
      node.inputs = {materialise(n->inputs[0], Layout::replicated(mesh_, n->inputs[0]->rank()))};
      node.step = collective_step(*n, node.global_shape);
      node.layout = node.step.after;
    } else {
      node.kind = LocalNode::Kind::Compute;
      node.op = n->op == OpKind::ToLocal ? OpKind::Reshape : n->op;
      node.attrs = n->attrs;
      // Blocks of uneven extents are blocks of a virtual global value (dsl/block_extents.hpp).
      const BlockExtents extents = extents_of(*n, mesh_);
      node.global_shape = extents_global_shape(extents);
      node.layout = extents_layout(extents);
      for (const auto& in : n->inputs)
        node.inputs.push_back(materialise(in, n->op == OpKind::ToLocal ? *n->attrs.layout : Layout::replicated(mesh_, in->rank())));
    }
    program_.nodes.push_back(std::move(node));
    return int(program_.nodes.size()) - 1;
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
        step.offset = int64_t(n.attrs.scalar);
        break;
      case OpKind::LocalChunk:
        step.after = extents_layout(split_over_d(in, n.attrs.axes[1]));
        break;
      default: throw InternalError(std::string("collective_step: ") + std::string(op_name(n.op)) + " is no collective");
    }
    int64_t elements = 1;
    for (int64_t e : shape) elements *= e;
    step.estimated_bytes = elements * dtype_size(n.dtype) * mesh_.size() / ways;
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

  // Local extents and offsets per device: constants where all devices agree, else parameters.
  void assign_symbolic_dims() {
    const std::vector<int64_t> ids = mesh_.local_device_ids();
    std::vector<std::vector<int64_t>> coords;
    for (int64_t id : ids) coords.push_back(mesh_.coords(id));
    program_.device_params.assign(ids.size(), {});
    std::map<std::vector<int64_t>, int> slots;  // identical per-device value lists share a slot
    auto symbolic = [&](const std::vector<int64_t>& per_device) {
      bool same = true;
      for (int64_t v : per_device) same &= v == per_device.front();
      if (same) return SymbolicDim{per_device.front(), -1};
      auto [it, inserted] = slots.try_emplace(per_device, program_.num_params);
      if (inserted) {
        ++program_.num_params;
        for (size_t d = 0; d < per_device.size(); ++d) program_.device_params[d].push_back(per_device[d]);
      }
      return SymbolicDim{0, it->second};
    };
    for (LocalNode& node : program_.nodes) {
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

  Mesh mesh_;
  std::unordered_set<const Node*> seen_;
  std::vector<const Node*> order_;
  std::unordered_map<const Node*, NodeInfo> info_;
  std::unordered_set<const Node*> requested_;                   // the program's outputs
  std::unordered_map<const Node*, ShardingDecision> chosen_;   // dots computed in a consumer's layout
  std::unordered_map<std::string, int64_t> cost_cache_;
  std::unordered_map<std::string, int> memo_;
  std::unordered_map<std::string, bool> available_;
  LocalProgram program_;
  Target target_;
};

}  // namespace

LocalProgram partition(const PartitionRequest& request) {
  Partitioner p(request.outputs, request.deterministic);
  return p.expand(request);
}

Layout propagated_layout(const NodeRef& node, bool deterministic) {
  if (auto value = node->value()) return value->layout;
  Partitioner p({node}, deterministic);
  return p.user_layout(node);
}

}  // namespace tessera
