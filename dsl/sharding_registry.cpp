#include "dsl/sharding_registry.hpp"

#include <atomic>
#include <limits>
#include <map>
#include <mutex>

#include "dsl/error.hpp"
#include "dsl/string_util.hpp"

namespace tessera {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, ShardingStrategyFn, std::less<>> strategies;
  std::atomic<size_t> size{0};  // lets every op skip the lock while nothing is registered
};

Registry& registry() {
  static Registry r;
  return r;
}

// The layout a strategy's placements give a tensor of `rank` (LayoutError naming the op).
Layout strategy_layout(std::string_view op, const Mesh& mesh, const std::vector<Placement>& placements, int64_t rank,
                       const std::string& what, Loc where) {
  if (int64_t(placements.size()) != mesh.ndim())
    throw LayoutError("register_sharding: a strategy of " + std::string(op) + " gives " + what + " " +
                      std::to_string(placements.size()) + " placements for a " + std::to_string(mesh.ndim()) +
                      "-dim mesh" + at_line(where));
  for (const Placement& p : placements)
    if (is_shard(p) && (std::get<Shard>(p).dim < 0 || std::get<Shard>(p).dim >= rank))
      throw LayoutError("register_sharding: a strategy of " + std::string(op) + " shards " + what + " on dim " +
                        std::to_string(std::get<Shard>(p).dim) + ", but it has rank " + std::to_string(rank) + at_line(where));
  return Layout::from_placements(mesh, placements, rank);
}

}  // namespace

void register_sharding(const std::string& op, ShardingStrategyFn strategies) {
  if (!strategies) throw Error("register_sharding: no strategy function given for " + op);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.strategies[op] = std::move(strategies);
  r.size = r.strategies.size();
}

void register_sharding(const std::vector<std::string>& ops, ShardingStrategyFn strategies) {
  for (const std::string& op : ops) register_sharding(op, strategies);
}

void deregister_sharding(const std::string& op) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.strategies.erase(op);
  r.size = r.strategies.size();
}

namespace detail {

bool any_registered_sharding() { return registry().size != 0; }

Tensor with_registered_sharding(std::string_view op, const std::vector<Tensor>& inputs, std::vector<int64_t> axes,
                                const std::function<Tensor(const std::vector<Tensor>&)>& build, Loc where) {
  Registry& r = registry();
  if (r.size == 0) return build(inputs);
  ShardingStrategyFn fn;
  {
    std::lock_guard lock(r.mutex);
    auto it = r.strategies.find(op);
    if (it == r.strategies.end()) return build(inputs);
    fn = it->second;
  }
  // Strategies place global tensors of one mesh; constants and local_map's local values have none.
  Mesh mesh;
  for (const Tensor& t : inputs) {
    if (t.node()->local) return build(inputs);
    if (!mesh.is_valid() && t.node()->mesh.is_valid()) mesh = t.node()->mesh;
  }
  if (!mesh.is_valid()) return build(inputs);

  ShardingCall call{std::string(op), {}, std::move(axes), mesh};
  for (const Tensor& t : inputs) call.input_shapes.push_back(t.shape());
  const std::vector<ShardingStrategy> strategies = fn(call);
  if (strategies.empty())
    throw LayoutError("register_sharding: the strategy function of " + std::string(op) + " offered no strategy" + at_line(where));

  std::vector<Layout> current;
  for (const Tensor& t : inputs) current.push_back(t.node()->mesh.is_valid() ? t.layout() : Layout());
  const ShardingStrategy* best = nullptr;
  std::vector<Layout> best_inputs;
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  for (const ShardingStrategy& s : strategies) {
    if (s.inputs.size() != inputs.size())
      throw LayoutError("register_sharding: a strategy of " + std::string(op) + " lists " + std::to_string(s.inputs.size()) +
                        " input placements for " + std::to_string(inputs.size()) + " tensor inputs" + at_line(where));
    std::vector<Layout> wanted(inputs.size());
    int64_t cost = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (s.inputs[i].empty()) continue;
      wanted[i] = strategy_layout(op, mesh, s.inputs[i], inputs[i].rank(), "input " + std::to_string(i), where);
      if (current[i].is_valid()) cost += redistribute_cost(inputs[i].shape(), inputs[i].dtype(), current[i], wanted[i]);
    }
    if (cost < best_cost) {  // ties: the first listed
      best_cost = cost;
      best = &s;
      best_inputs = std::move(wanted);
    }
  }
  std::vector<Tensor> placed = inputs;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (best_inputs[i].is_valid()) placed[i] = with_layout(inputs[i], best_inputs[i], where);
  Tensor out = build(placed);
  return with_layout(out, strategy_layout(op, mesh, best->output, out.rank(), "its output", where), where);
}

}  // namespace detail
}  // namespace tessera
