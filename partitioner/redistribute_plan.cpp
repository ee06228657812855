#include "partitioner/redistribute_plan.hpp"

#include <algorithm>
#include <map>
#include <queue>
#include <tuple>

#include "dsl/element_count.hpp"
#include "dsl/error.hpp"
#include "dsl/shard_geometry.hpp"
#include "dsl/string_util.hpp"

namespace tessera {

namespace {

// A compact, ordered key of a layout state (axes' mesh-dim lists and the partial ops).
std::string state_key(const Layout& layout) {
  std::string key;
  for (const auto& dims : layout.axis_mesh_dims()) {
    for (int64_t d : dims) key += char('0' + d);
    key += '|';
  }
  for (const auto& p : layout.partial_ops()) key += p ? char('a' + int(*p)) : '-';
  return key;
}

// Bytes held by all devices of the mesh together under `layout` (replicas counted each time).
// Shards of an axis partition it (torch.chunk), so the sharded axes add up to the global shape
// once, and every mesh dim that shards no axis holds that many copies (replicas, or Partial terms).
int64_t mesh_bytes(const std::vector<int64_t>& shape, DType dtype, const Layout& layout) {
  const std::vector<int64_t> sizes = layout.mesh().shape();
  int64_t total = dtype_size(dtype) * element_count(shape);
  for (size_t d = 0; d < sizes.size(); ++d)
    if (!layout.sharded_axis_of(int64_t(d))) total *= sizes[d];
  return total;
}

struct Edge {
  RedistributeKind kind;
  int64_t mesh_dim;
  Layout after;
  ReduceOp op;
  int64_t bytes;
};

std::vector<Edge> next_steps(const std::vector<int64_t>& shape, DType dtype, const Layout& state,
                             const std::vector<Placement>& target) {
  std::vector<Edge> out;
  const std::vector<int64_t> mesh_shape = state.mesh().shape();
  const std::vector<Placement> current = state.placements();
  // Costs are the bytes all devices receive: gathers receive what they did not hold; all_to_all
  // and reduce_scatter receive (k-1)/k of what they hold; all_reduce twice that.
  const int64_t here = mesh_bytes(shape, dtype, state);
  for (int64_t m = 0; m < int64_t(mesh_shape.size()); ++m) {
    const int64_t k = mesh_shape[m];
    const Placement& want = target[m];
    if (k == 1) {
      // One device along this dim: every placement holds the same data (splitting by one changes
      // no block, wherever the dim sits in an axis's list), so any change is a local relabel.
      for (const Placement& to : {Placement(Replicate{}), want})
        if (!(current[m] == to) || (std::holds_alternative<Shard>(to) && state.axis_mesh_dims()[std::get<Shard>(to).dim].back() != m))
          out.push_back({RedistributeKind::LocalChunk, m, state.with_placement(m, to), ReduceOp::Sum, 0});
      continue;
    }
    const auto* want_shard = std::get_if<Shard>(&want);
    const auto* want_partial = std::get_if<Partial>(&want);
    if (auto* s = std::get_if<Shard>(&current[m])) {
      const auto& dims = state.axis_mesh_dims()[s->dim];
      if (dims.back() != m) continue;  // only the innermost mesh dim of an axis can move
      Layout gathered = state.with_placement(m, Replicate{});
      out.push_back({RedistributeKind::AllGather, m, gathered, ReduceOp::Sum,
                     mesh_bytes(shape, dtype, gathered) - here});
      if (want_shard && want_shard->dim != s->dim)
        out.push_back({RedistributeKind::AllToAll, m, state.with_placement(m, want), ReduceOp::Sum, here * (k - 1) / k});
    } else if (auto* p = std::get_if<Partial>(&current[m])) {
      if (want_partial && want_partial->op == p->op) continue;
      out.push_back({RedistributeKind::AllReduce, m, state.with_placement(m, Replicate{}), p->op, 2 * here * (k - 1) / k});
      if (want_shard)
        out.push_back({RedistributeKind::ReduceScatter, m, state.with_placement(m, want), p->op, here * (k - 1) / k});
    } else {  // Replicate
      if (want_shard) out.push_back({RedistributeKind::LocalChunk, m, state.with_placement(m, want), ReduceOp::Sum, 0});
      if (want_partial)
        out.push_back({RedistributeKind::LocalPartial, m, state.with_placement(m, want), want_partial->op, 0});
    }
  }
  return out;
}

}  // namespace

std::vector<RedistributeStep> plan_redistribute(const std::vector<int64_t>& shape, DType dtype,
                                                const Layout& from, const Layout& to) {
  if (from.mesh() != to.mesh())
    throw LayoutError("cannot redistribute between different meshes: from " + from.mesh().to_string() + " to " +
                      to.mesh().to_string());
  if (from.rank() != to.rank() || int64_t(shape.size()) != to.rank())
    throw LayoutError("cannot redistribute a rank-" + std::to_string(shape.size()) + " tensor with layout of rank " +
                      std::to_string(from.rank()) + " to a layout of rank " + std::to_string(to.rank()));
  if (from == to) return {};
  const std::vector<Placement> target = to.placements();
  const std::string goal = state_key(to);

  // Dijkstra; ties broken by fewer steps, then by insertion order (deterministic plans).
  using Cost = std::tuple<int64_t, int64_t, int64_t>;  // bytes, steps, sequence
  struct Visit { Layout layout; std::string parent; RedistributeStep step; bool has_step; };
  std::map<std::string, Cost> best;
  std::map<std::string, Visit> visits;
  std::priority_queue<std::pair<Cost, std::string>, std::vector<std::pair<Cost, std::string>>, std::greater<>> queue;
  int64_t sequence = 0;
  const std::string start = state_key(from);
  best[start] = {0, 0, sequence};
  visits[start] = {from, "", {}, false};
  queue.push({best[start], start});
  while (!queue.empty()) {
    auto [cost, key] = queue.top();
    queue.pop();
    if (cost > best[key]) continue;
    if (key == goal) break;
    const Layout state = visits.at(key).layout;
    for (Edge& e : next_steps(shape, dtype, state, target)) {
      std::string next = state_key(e.after);
      Cost c{std::get<0>(cost) + e.bytes, std::get<1>(cost) + 1, ++sequence};
      auto it = best.find(next);
      if (it != best.end() && std::tie(std::get<0>(it->second), std::get<1>(it->second)) <=
                                  std::tie(std::get<0>(c), std::get<1>(c)))
        continue;
      best[next] = c;
      visits[next] = {e.after, key, {e.kind, e.mesh_dim, state, e.after, e.op, e.bytes}, true};
      queue.push({c, next});
    }
  }
  if (!visits.count(goal))
    throw InternalError("redistribute planner found no path from " + from.to_string() + " to " + to.to_string());
  std::vector<RedistributeStep> plan;
  for (std::string key = goal; visits.at(key).has_step; key = visits.at(key).parent) plan.push_back(visits.at(key).step);
  std::reverse(plan.begin(), plan.end());
  // The final step lands on `to` itself (same state key; keep the caller's handle).
  plan.back().after = to;
  return plan;
}

std::string describe_plan(const std::vector<RedistributeStep>& plan) {
  if (plan.empty()) return "(no steps)";
  return join(plan, "; ", [](const RedistributeStep& s) {
    std::string dim = s.before.mesh().dim_names()[s.mesh_dim];
    return std::string(redistribute_kind_name(s.kind)) + "(" + dim + "): [" +
           join(s.before.sharding_specs(), ",") + "] -> [" +
           join(s.after.sharding_specs(), ",") + "]";
  });
}

}  // namespace tessera
