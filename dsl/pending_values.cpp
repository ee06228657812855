#include "dsl/pending_values.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "dsl/gradient_rule.hpp"
#include "dsl/live_registry.hpp"

namespace tessera {

struct PendingValueWatch::Built {
  std::vector<std::weak_ptr<const Node>> nodes;
  size_t prune_at = 1024;  // entries at which dead ones are dropped (a long loop inside a watch)
};

namespace {

LiveRegistry<PendingValueWatch::Built>& watches() {
  static auto& registry = *new LiveRegistry<PendingValueWatch::Built>();  // nodes outlive statics
  return registry;
}

}  // namespace

PendingValueWatch::PendingValueWatch() : built_(watches().open()) {}

PendingValueWatch::~PendingValueWatch() { watches().close(built_); }

void note_node_built(const NodeRef& node) {
  if (!watches().any_open()) return;
  watches().for_each_open([&](PendingValueWatch::Built& built) {
    if (built.nodes.size() >= built.prune_at) {
      std::erase_if(built.nodes, [](const std::weak_ptr<const Node>& w) { return w.expired(); });
      built.prune_at = std::max<size_t>(1024, 2 * built.nodes.size());
    }
    built.nodes.push_back(node);
  });
}

std::vector<NodeRef> PendingValueWatch::pending_results() const {
  // Each once (hash-consing finds a node again), in build order.
  std::vector<NodeRef> alive = watches().read(*built_, [](const Built& built) {
    std::vector<NodeRef> out;
    std::unordered_set<const Node*> seen;
    for (const auto& weak : built.nodes)
      if (NodeRef node = weak.lock(); node && seen.insert(node.get()).second) out.push_back(std::move(node));
    return out;
  });
  // A node another built here consumes is computed inside that one's program, unless something
  // else (a Tensor the user holds, a Variable) also holds it: such a value is looked at on its
  // own later, so it is computed now too, in the same program. References: one from `alive`,
  // one from each consumer built here; more mean an outside holder. A gradient rule's inputs
  // (dsl/gradient_rule.hpp) count as its node's: the backward reads them, nothing else.
  std::unordered_map<const Node*, long> consumer_refs;
  for (const NodeRef& node : alive) {
    for (const NodeRef& input : node->inputs) ++consumer_refs[input.get()];
    if (const auto& rule = node->attrs.gradient_rule)
      for (const NodeRef& input : rule->inputs) ++consumer_refs[input.get()];
  }
  std::vector<NodeRef> results;
  for (const NodeRef& node : alive) {
    const bool computable = node->mesh.is_valid() && !node->traced && !node->local && !node->value();
    const auto consumed = consumer_refs.find(node.get());
    const bool held_outside = consumed == consumer_refs.end() || node.use_count() > consumed->second + 1;
    if (computable && held_outside) results.push_back(node);
  }
  return results;
}

}  // namespace tessera
