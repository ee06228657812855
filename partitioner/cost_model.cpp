#include "partitioner/cost_model.hpp"

#include "dsl/sharding_registry.hpp"

namespace tessera {

int64_t plan_cost(const std::vector<RedistributeStep>& plan) {
  int64_t cost = 0;
  for (const auto& step : plan)
    if (is_collective(step.kind)) cost += kCollectiveAlphaBytes + step.estimated_bytes;
  return cost;
}

}  // namespace tessera

namespace tessera::detail {

// register_sharding (dsl/sharding_registry.hpp) prices its strategies with the planner's costs.
int64_t redistribute_cost(const std::vector<int64_t>& shape, DType dtype, const Layout& from, const Layout& to) {
  if (from == to) return 0;
  return plan_cost(plan_redistribute(shape, dtype, from, to));
}

}  // namespace tessera::detail
