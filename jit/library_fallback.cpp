#include "jit/library_fallback.hpp"

#include <functional>
#include <unordered_set>

#include "dsl/attention.hpp"
#include "dsl/attention_parts.hpp"
#include "dsl/comm_module_scope.hpp"
#include "dsl/grouped_matmul.hpp"
#include "dsl/program_order_scope.hpp"
#include "jit/library_call.hpp"

namespace tessera {
namespace {

bool is_grouped_primitive(const Node& n) { return n.op == OpKind::GroupedDot || n.op == OpKind::GroupedWeightGrad; }

bool target_lacks(const Node& n, const Target& target) {
  if (is_grouped_primitive(n)) return !target.runs(grouped_library_op(n.op));
  return n.op == OpKind::Attention && !target.runs(library_op_of(attention_attrs(n.attrs).part));
}

// Whether `target` lacks a primitive the graph uses: the common case walks the graph once and
// builds nothing.
bool needs_fallbacks(const std::vector<NodeRef>& outputs, const Target& target) {
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> stack;
  for (const NodeRef& out : outputs) stack.push_back(out.get());
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second || n->value()) continue;
    if (target_lacks(*n, target)) return true;
    if (n->op == OpKind::MeshTransfer) continue;  // its input belongs to another mesh's program
    for (const NodeRef& in : n->inputs) stack.push_back(in.get());
  }
  return false;
}

class Rewriter {
 public:
  explicit Rewriter(const Target& target) : target_(target) {}

  NodeRef rewrite(const NodeRef& n) {
    if (n->value() || n->inputs.empty() || n->op == OpKind::MeshTransfer) return n;
    if (auto it = done_.find(n.get()); it != done_.end()) return it->second;
    std::vector<NodeRef> inputs;
    bool changed = false;
    for (const NodeRef& in : n->inputs) {
      inputs.push_back(rewrite(in));
      changed |= inputs.back() != in;
    }
    NodeRef out = n;
    {
      // Built in the node's module, so its collectives are reported there, and at its program
      // order position (dsl/program_order_scope.hpp).
      const CommModuleScope scope = CommModuleScope::replacing(n->module);
      const ProgramOrderScope in_order(n->program_order);
      if (target_lacks(*n, target_)) {
        out = is_grouped_primitive(*n) ? detail::grouped_from_ops(*n, inputs)
                                       : detail::attention_part_from_ops(attention_attrs(n->attrs), inputs, n->where);
        if (n->attrs.recomputed) out = recomputed_parts(out, inputs);
        note_parts(out, inputs, n);
      } else if (changed) {
        out = make_node(n->op, n->dtype, n->shape, std::move(inputs), n->attrs, n->where);
      }
    }
    if (out != n) graph_.stands_for.emplace(out.get(), n);
    done_.emplace(n.get(), out);
    return out;
  }

  FallbackGraph take() { return std::move(graph_); }

 private:
  // The parts of a recomputed primitive (a checkpointed region's copy, dsl/checkpoint.hpp),
  // rebuilt as recomputed copies too: recompute placement (partitioner/recompute_placement.hpp)
  // then runs them where the backward reads them, as it does the primitive's other copies.
  NodeRef recomputed_parts(const NodeRef& replacement, const std::vector<NodeRef>& inputs) {
    std::unordered_map<const Node*, NodeRef> rebuilt;
    for (const NodeRef& in : inputs) rebuilt.emplace(in.get(), in);
    std::function<NodeRef(const NodeRef&)> rebuild = [&](const NodeRef& n) -> NodeRef {
      if (auto it = rebuilt.find(n.get()); it != rebuilt.end()) return it->second;
      if (n->value() || (n->inputs.empty() && n->attrs.recomputed)) return n;
      std::vector<NodeRef> parts_inputs;
      for (const NodeRef& in : n->inputs) parts_inputs.push_back(rebuild(in));
      NodeAttrs attrs = n->attrs;
      attrs.recomputed = true;
      return rebuilt[n.get()] = make_node(n->op, n->dtype, n->shape, std::move(parts_inputs), std::move(attrs), n->where);
    };
    return rebuild(replacement);
  }

  // The nodes between a primitive's replacement and its inputs stand for the primitive.
  void note_parts(const NodeRef& replacement, const std::vector<NodeRef>& inputs, const NodeRef& primitive) {
    std::unordered_set<const Node*> stop;
    for (const NodeRef& in : inputs) stop.insert(in.get());
    std::vector<NodeRef> stack = {replacement};
    while (!stack.empty()) {
      NodeRef n = std::move(stack.back());
      stack.pop_back();
      if (stop.count(n.get()) || n->value() || !graph_.stands_for.emplace(n.get(), primitive).second) continue;
      for (const NodeRef& in : n->inputs) stack.push_back(in);
    }
  }

  const Target& target_;
  std::unordered_map<const Node*, NodeRef> done_;
  FallbackGraph graph_;
};

}  // namespace

FallbackGraph with_library_fallbacks(const std::vector<NodeRef>& outputs, const Target& target) {
  if (!needs_fallbacks(outputs, target)) return FallbackGraph{outputs, {}};
  Rewriter rewriter(target);
  std::vector<NodeRef> rewritten;
  for (const NodeRef& out : outputs) rewritten.push_back(rewriter.rewrite(out));
  FallbackGraph graph = rewriter.take();
  graph.outputs = std::move(rewritten);
  return graph;
}

}  // namespace tessera
