// Whole-graph sharding propagation: the first phase of partitioning (spmd_expansion.hpp).
//
// Propagation runs forward from the values already computed (their layouts are fixed), sources
// with a requested layout, and with_layout constraints; each op's rule (sharding_rules.hpp)
// picks its output layout by the cost of the redistributes it needs. Constants, iota and random
// numbers with no layout of their own are "free": they take whatever layout their consumer
// wants. Two second looks at dots may then fix a dot's layout and propagate again downstream.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dsl/node.hpp"
#include "ir/target.hpp"
#include "partitioner/sharding_rules.hpp"

namespace tessera {

// Generated values (constants, iota, random numbers), which cost nothing to make in any layout.
bool is_generated_source(OpKind op);
// Ops a consumer may recompute in the layout it wants rather than have their result moved.
bool is_cheap(OpKind op);

// What propagation decided for one node of the pending graph.
struct NodeInfo {
  Layout natural;
  bool free = false;
  bool is_input = false;
  std::vector<Layout> required_inputs;  // the rule's input layouts for the natural layout
};

class ShardingPropagation {
 public:
  // Propagates over the pending graph that `outputs` need (LayoutError when it has no mesh).
  ShardingPropagation(const std::vector<NodeRef>& outputs, const Target& target);
  // Layouts already decided for some pending nodes (answers to earlier layout queries): they are
  // taken as given, like computed values, and their inputs are not visited.
  using Known = std::function<std::optional<Layout>(const Node*)>;
  ShardingPropagation(const std::vector<NodeRef>& outputs, const Target& target, Known known);

  const Mesh& mesh() const { return mesh_; }
  const Target& target() const { return target_; }
  const NodeInfo& info(const Node* n) const { return info_.at(n); }

  // The layout a value is handed to the user in: the one its op gives it, Partial included, as
  // PyTorch's DTensor leaves a sum of partial terms unreduced until it is asked for
  // (full_tensor, redistribute): looking at a value runs no collective the reference would not.
  Layout user_layout(const NodeRef& n) const;

  // Bytes of moving `value` between two layouts (cost_model.hpp), memoised: expansion prices
  // the same moves again.
  int64_t cost(const Node& value, const Layout& from, const Layout& to);

 private:
  using Consumers = std::unordered_map<const Node*, std::vector<const Node*>>;

  void visit(const NodeRef& n);
  void propagate(const Node& n);
  std::optional<std::vector<Layout>> required_of(const Node* n, const Consumers& consumers);
  bool choose_gathered_contractions();
  bool choose_weight_stationary_dots();
  std::optional<Layout> agreed_unreduced_target(const Node* n, const Consumers& consumers);
  Consumers consumers_of_pending() const;
  std::unordered_set<Layout> moved_layouts(const Node* value, const Node* except, const Consumers& consumers);

  // The memo key of a move: what its plan depends on (the value's shape and dtype, both
  // layouts), not which value moves: a repeated block's values (a pipeline's every tick) move
  // alike, and planning a move is a tenth of a pipeline's planning.
  struct CostKey {
    std::vector<int64_t> shape;
    DType dtype;
    Layout from, to;
    bool operator==(const CostKey&) const = default;
  };
  struct CostKeyHash {
    size_t operator()(const CostKey& key) const;
  };

  Mesh mesh_;
  // Gradient layout hints whose value more than one consumer reads (the program's outputs count):
  // a partial sum behind one is reduced once, into the hinted layout (shared_hints_of).
  std::unordered_set<const Node*> shared_hints_;
  Target target_;
  Known known_;
  std::unordered_set<const Node*> seen_;
  std::vector<const Node*> order_;
  std::unordered_map<const Node*, NodeInfo> info_;
  std::unordered_set<const Node*> requested_;                  // the program's outputs
  std::unordered_map<const Node*, ShardingDecision> chosen_;  // dots computed in a consumer's layout
  std::unordered_map<CostKey, int64_t, CostKeyHash> cost_cache_;
};

}  // namespace tessera
