#include "partitioner/spmd_expansion.hpp"

#include "partitioner/expansion.hpp"
#include "partitioner/propagation.hpp"

namespace tessera {

LocalProgram partition(const PartitionRequest& request) {
  ShardingPropagation propagation(request.outputs, request.target);
  return expand(propagation, request);
}

}  // namespace tessera
