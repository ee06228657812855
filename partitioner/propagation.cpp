#include "partitioner/propagation.hpp"

#include <mutex>

#include "dsl/dot_form.hpp"
#include "dsl/error.hpp"
#include "partitioner/cost_model.hpp"
#include "partitioner/spmd_expansion.hpp"

namespace tessera {

bool is_generated_source(OpKind op) { return op_category(op) == OpCategory::Source && op != OpKind::Leaf; }
bool is_cheap(OpKind op) { return (is_elementwise(op) && !is_expensive(op)) || is_movement(op); }

ShardingPropagation::ShardingPropagation(const std::vector<NodeRef>& outputs, const Target& target)
    : ShardingPropagation(outputs, target, nullptr) {}

ShardingPropagation::ShardingPropagation(const std::vector<NodeRef>& outputs, const Target& target, Known known)
    : target_(target), known_(std::move(known)) {
  for (const auto& out : outputs)
    if (out->mesh.is_valid()) {
      mesh_ = out->mesh;
      break;
    }
  if (!mesh_.is_valid())
    throw LayoutError("cannot place a computation that has no mesh: give one of its sources a layout");
  if (target_.device != mesh_.device_kind())
    throw InternalError("partitioning for a " + target_.to_string() + " target on a mesh of " +
                        std::string(device_kind_name(mesh_.device_kind())) + " devices");
  for (const auto& out : outputs)
    if (out->local)
      throw LayoutError("a local value of local_map (made at " + out->location() +
                        ") has no global value or layout of its own: return it from the local_map'ed function");
  for (const auto& out : outputs) {
    visit(out);
    requested_.insert(out.get());
  }
  const Consumers consumers = consumers_of_pending();
  for (const Node* n : order_) {
    if (n->op != OpKind::LayoutHint) continue;
    auto it = consumers.find(n);
    if ((it == consumers.end() ? 0 : it->second.size()) + requested_.count(n) > 1) shared_hints_.insert(n);
  }
  for (const Node* n : order_) propagate(*n);
  for (auto choose : {&ShardingPropagation::choose_gathered_contractions, &ShardingPropagation::choose_weight_stationary_dots})
    if ((this->*choose)()) {
      info_.clear();
      for (const Node* n : order_) propagate(*n);
    }
}

Layout ShardingPropagation::user_layout(const NodeRef& n) const {
  if (n->op == OpKind::LayoutHint && !info(n.get()).is_input) return *n->attrs.layout;
  return info(n.get()).natural;
}

size_t ShardingPropagation::CostKeyHash::operator()(const CostKey& key) const {
  uint64_t h = hash_mix(hash_mix(uint64_t(key.dtype), hash_value(key.from)), hash_value(key.to));
  for (int64_t extent : key.shape) h = hash_mix(h, uint64_t(extent));
  return size_t(h);
}

int64_t ShardingPropagation::cost(const Node& value, const Layout& from, const Layout& to) {
  if (from == to) return 0;
  CostKey key{value.shape, value.dtype, from, to};
  auto it = cost_cache_.find(key);
  if (it != cost_cache_.end()) return it->second;
  int64_t c = plan_cost(plan_redistribute(value.shape, value.dtype, from, to));
  cost_cache_.emplace(std::move(key), c);
  return c;
}

// Post-order over the pending part of the graph; computed values stop the walk.
void ShardingPropagation::visit(const NodeRef& n) {
  if (!seen_.insert(n.get()).second) return;
  const bool given = n->value() || (known_ && known_(n.get()));
  if (!given && n->op != OpKind::MeshTransfer)  // a transfer's input lives on another mesh
    for (const auto& in : n->inputs) visit(in);
  order_.push_back(n.get());
}

// The layouts the consumers of `n` require of it, looking through layout hints (which are
// transparent); nullopt when a consumer takes it as is (a program output).
std::optional<std::vector<Layout>> ShardingPropagation::required_of(const Node* n, const Consumers& consumers) {
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
bool ShardingPropagation::choose_gathered_contractions() {
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
bool ShardingPropagation::choose_weight_stationary_dots() {
  const auto consumers = consumers_of_pending();
  bool any = false;
  for (const Node* n : order_) {
    const NodeInfo& ni = info(n);
    if (n->op != OpKind::Dot || n->local || chosen_.count(n) || ni.is_input || ni.free ||
        avoid_partial_sum(n->dtype, target_) || ni.natural.has_partial())
      continue;
    const Node *a = n->inputs[0].get(), *b = n->inputs[1].get();
    // A 2-D product, or rows [..., k] x [k, n] (dsl/dot_form.hpp): b is the weight.
    if (b->rank() != 2 || (a->rank() != 2 && dot_form(a->rank(), 2, n->rank()) != DotForm::Rows)) continue;
    if (info(b).free || !info(b).natural.is_fully_replicated() || !ni.required_inputs[1].is_fully_replicated()) continue;
    const Layout& a_now = ni.required_inputs[0];
    const auto& a_axes = a_now.axis_mesh_dims();
    // Rows sharded along one axis over one mesh dim, k whole.
    std::vector<int64_t> row_dims;
    for (size_t ax = 0; ax + 1 < a_axes.size(); ++ax) row_dims.insert(row_dims.end(), a_axes[ax].begin(), a_axes[ax].end());
    if (a_now.has_partial() || row_dims.size() != 1 || !a_axes.back().empty()) continue;
    const int64_t d = row_dims[0];
    const auto target_or = agreed_unreduced_target(n, consumers);
    if (!target_or) continue;
    const Layout& target = *target_or;
    std::vector<std::optional<ReduceOp>> partial(size_t(mesh_.ndim()));
    partial[size_t(d)] = ReduceOp::Sum;
    std::vector<std::vector<int64_t>> a_split(a_axes.size());
    a_split.back() = {d};
    const ShardingDecision split{Layout(mesh_, std::vector<std::vector<int64_t>>(size_t(n->rank())), partial),
                                 {Layout(mesh_, a_split), Layout(mesh_, {{d}, {}})}};
    const Layout a_natural = info(a).natural;
    const bool a_moved_anyway = moved_layouts(a, n, consumers).count(split.inputs[0]) > 0;
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
std::optional<Layout> ShardingPropagation::agreed_unreduced_target(const Node* n, const Consumers& consumers) {
  const auto wanted = required_of(n, consumers);
  if (!wanted || wanted->empty() || wanted->front().has_partial()) return std::nullopt;
  for (const Layout& w : *wanted)
    if (w != wanted->front()) return std::nullopt;
  return wanted->front();
}

ShardingPropagation::Consumers ShardingPropagation::consumers_of_pending() const {
  Consumers consumers;
  for (const Node* n : order_)
    if (!n->value())
      for (const auto& in : n->inputs) consumers[in.get()].push_back(n);
  return consumers;
}

// The layouts that consumers of `value` other than `except` will materialise it in: what they
// require, also through the movement ops (transposes) that move their input instead.
std::unordered_set<Layout> ShardingPropagation::moved_layouts(const Node* value, const Node* except,
                                                              const Consumers& consumers) {
  std::unordered_set<Layout> out;
  auto it = consumers.find(value);
  if (it == consumers.end()) return out;
  for (const Node* c : it->second) {
    if (c == except) continue;
    const NodeInfo& ci = info(c);
    for (size_t i = 0; i < c->inputs.size() && i < ci.required_inputs.size(); ++i)
      if (c->inputs[i].get() == value) out.insert(ci.required_inputs[i]);
    if (!is_movement(c->op) || c->inputs.size() != 1) continue;
    if (auto wanted = required_of(c, consumers))
      for (const Layout& w : *wanted)
        if (auto ins = layouts_producing(*c, w)) out.insert((*ins)[0]);
  }
  return out;
}

void ShardingPropagation::propagate(const Node& n) {
  NodeInfo& ni = info_[&n];
  if (auto chosen = chosen_.find(&n); chosen != chosen_.end()) {
    ni.natural = chosen->second.output;
    ni.required_inputs = chosen->second.inputs;
    return;
  }
  if (known_ && !n.value())
    if (auto layout = known_(&n)) {
      ni.natural = *layout;
      ni.is_input = true;
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
  if (is_generated_source(n.op)) {
    ni.free = !n.attrs.layout.has_value();
    ni.natural = ni.free ? Layout::replicated(mesh_, n.rank()) : *n.attrs.layout;
    return;
  }
  if (n.op == OpKind::LayoutHint) {  // transparent inside the program
    ni = info_.at(n.inputs[0].get());
    ni.is_input = false;
    // Except for a partial sum that several consumers read (a gradient that clipping measures
    // and scales, then the optimizer reads): each would reduce it on its own, into a layout of
    // its choosing, and the scaling would keep the unreduced terms alive to the end. It is
    // reduced once, into the hinted layout (PyTorch's .grad, in its parameter's placements).
    if (ni.natural.has_partial() && !ni.free && shared_hints_.count(&n)) ni.natural = *n.attrs.layout;
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

namespace {

// Layouts answered to queries of pending nodes, by node, while the node lives. A later query
// takes them as given: model code asks the layout of each new activation (parallel styles'
// placements), and re-propagating the whole growing graph for each made tracing a deep model
// quadratic in its depth (a 96-layer GPT: 140 s). PyTorch's DTensor fixes a value's placements
// when its op runs, as this does.
struct LayoutQueries {
  struct Answer {
    std::weak_ptr<const Node> node;
    Layout layout;
    bool deterministic;
  };
  std::mutex mutex;
  std::unordered_map<const Node*, Answer> answers;
  size_t prune_at = 4096;
};

LayoutQueries& layout_queries() {
  static LayoutQueries* q = new LayoutQueries();
  return *q;
}

}  // namespace

Layout propagated_layout(const NodeRef& node, const Target& target) { return propagated_layouts({node}, target).front(); }

std::vector<Layout> propagated_layouts(const std::vector<NodeRef>& nodes, const Target& target) {
  LayoutQueries& q = layout_queries();
  auto known = [&](const Node* n) -> std::optional<Layout> {
    std::lock_guard lock(q.mutex);
    auto it = q.answers.find(n);
    if (it == q.answers.end() || it->second.deterministic != target.deterministic || it->second.node.expired()) return std::nullopt;
    return it->second.layout;
  };
  std::vector<std::optional<Layout>> out(nodes.size());
  std::vector<NodeRef> asked;  // neither computed nor answered before: one propagation for all
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (auto value = nodes[i]->value()) out[i] = value->layout;
    else if (auto answered = known(nodes[i].get())) out[i] = *answered;  // a live entry at this address is this node
    else asked.push_back(nodes[i]);
  }
  if (!asked.empty()) {
    const ShardingPropagation propagation(asked, target, known);
    std::lock_guard lock(q.mutex);
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (out[i]) continue;
      out[i] = propagation.user_layout(nodes[i]);
      q.answers[nodes[i].get()] = {nodes[i], *out[i], target.deterministic};
    }
    if (q.answers.size() >= q.prune_at) {  // forget dead nodes now and then
      std::erase_if(q.answers, [](const auto& entry) { return entry.second.node.expired(); });
      q.prune_at = std::max<size_t>(4096, 2 * q.answers.size());
    }
  }
  std::vector<Layout> layouts;
  for (std::optional<Layout>& layout : out) layouts.push_back(std::move(*layout));
  return layouts;
}

}  // namespace tessera
