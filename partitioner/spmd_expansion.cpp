#include "partitioner/spmd_expansion.hpp"

#include "dsl/deep_stack.hpp"
#include "ir/local_program_verify.hpp"
#include "partitioner/expansion.hpp"
#include "partitioner/propagation.hpp"
#include "partitioner/recompute_placement.hpp"
#include "partitioner/reduction_placement.hpp"
#include "partitioner/scope_order_placement.hpp"

namespace tessera {

LocalProgram partition(const PartitionRequest& request) {
  // Expansion recurses along the longest chain of dependent ops (dsl/deep_stack.hpp).
  return on_deep_stack([&] {
    ShardingPropagation propagation(request.outputs, request.target);
    LocalProgram program = expand(propagation, request);
    place_in_scope_order(program);
    place_recomputed_values_late(program);
    place_reductions_early(program);
    verify(program);  // expansion's and the reordering passes' invariants (ir/local_program_verify.hpp)
    return program;
  });
}

}  // namespace tessera
