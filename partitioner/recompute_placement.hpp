// Where recomputed values run: the backward's copies of checkpointed values
// (dsl/checkpoint.hpp) depend only on the region's inputs, so expansion, which emits a value at
// its first use in a depth-first walk, may emit them long before the backward needs them, and
// they would then live as long as the values they replace. This pass moves each recomputed copy
// (and whatever only such copies read: the redistributes and constants expansion made for them)
// to just before the first step that reads it, keeping the program in topological order.
#pragma once

#include "ir/local_program.hpp"

namespace tessera {

void place_recomputed_values_late(LocalProgram& program);

}  // namespace tessera
