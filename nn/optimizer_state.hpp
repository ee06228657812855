// What SGD and Adam share: their state Variables' layouts and the check of apply()'s arguments.
// The state is sharded over the mesh dims the variable is replicated on (ZeRO stage 1):
// data-parallel devices each update a slice.
#pragma once

#include <vector>

#include "dsl/variable.hpp"

namespace tessera {

// A zero Variable shaped like `v` for optimizer state: v's layout plus its first unsharded axis
// split over every mesh dim on which v is replicated, or v's layout for small variables.
Variable sharded_state_like(const Variable& v);

// ShapeError unless there is one gradient per variable; `who` names the optimizer.
void check_gradients(const std::vector<Variable>& vars, const std::vector<Tensor>& grads, const char* who);

}  // namespace tessera
