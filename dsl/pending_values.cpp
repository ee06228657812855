#include "dsl/pending_values.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace tessera {

struct PendingValueWatch::Built {
  std::vector<std::weak_ptr<const Node>> nodes;
  size_t prune_at = 1024;  // entries at which dead ones are dropped (a long loop inside a watch)
};

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::shared_ptr<PendingValueWatch::Built>>& open_watches() {
  static std::vector<std::shared_ptr<PendingValueWatch::Built>> watches;
  return watches;
}
std::atomic<int> open_count{0};

}  // namespace

PendingValueWatch::PendingValueWatch() : built_(std::make_shared<Built>()) {
  std::lock_guard lock(registry_mutex());
  open_watches().push_back(built_);
  ++open_count;
}

PendingValueWatch::~PendingValueWatch() {
  std::lock_guard lock(registry_mutex());
  std::erase(open_watches(), built_);
  --open_count;
}

void note_node_built(const NodeRef& node) {
  if (open_count.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard lock(registry_mutex());
  for (auto& built : open_watches()) {
    if (built->nodes.size() >= built->prune_at) {
      std::erase_if(built->nodes, [](const std::weak_ptr<const Node>& w) { return w.expired(); });
      built->prune_at = std::max<size_t>(1024, 2 * built->nodes.size());
    }
    built->nodes.push_back(node);
  }
}

std::vector<NodeRef> PendingValueWatch::pending_results() const {
  std::vector<NodeRef> alive;  // each once (hash-consing finds a node again), in build order
  {
    std::unordered_set<const Node*> seen;
    std::lock_guard lock(registry_mutex());
    for (const auto& weak : built_->nodes)
      if (NodeRef node = weak.lock(); node && seen.insert(node.get()).second) alive.push_back(std::move(node));
  }
  // A node another built here consumes is computed inside that one's program, unless something
  // else (a Tensor the user holds, a Variable) also holds it: such a value is looked at on its
  // own later, so it is computed now too, in the same program. References: one from `alive`,
  // one from each consumer built here; more mean an outside holder.
  std::unordered_map<const Node*, long> consumer_refs;
  for (const NodeRef& node : alive)
    for (const NodeRef& input : node->inputs) ++consumer_refs[input.get()];
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
