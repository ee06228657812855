#include "partitioner/spmd_expansion.hpp"

#include "partitioner/expansion.hpp"
#include "partitioner/propagation.hpp"
#include "partitioner/recompute_placement.hpp"
#include "partitioner/reduction_placement.hpp"
#include "partitioner/scope_order_placement.hpp"

namespace tessera {

LocalProgram partition(const PartitionRequest& request) {
  ShardingPropagation propagation(request.outputs, request.target);
  LocalProgram program = expand(propagation, request);
  place_in_scope_order(program);
  place_recomputed_values_late(program);
  place_reductions_early(program);
  return program;
}

}  // namespace tessera
