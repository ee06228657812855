#include "partitioner/cost_model.hpp"

namespace tessera {

int64_t plan_cost(const std::vector<RedistributeStep>& plan) {
  int64_t cost = 0;
  for (const auto& step : plan)
    if (is_collective(step.kind)) cost += kCollectiveAlphaBytes + step.estimated_bytes;
  return cost;
}

}  // namespace tessera
