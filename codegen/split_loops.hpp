// Loop splitting at the divisors a loop's index arithmetic uses.
//
// A reshape that merges axes reads its input at v / c and v % c (c: the inner axis's extent).
// Inside a loop over v that costs a division per element and hides the contiguous runs from
// the vectoriser: a head-merging permute ([B, H, T, E] -> [B*T, H*E]) copied or column-reduced
// at a third of the speed of a contiguous read. When a serial loop runs over [0, trip) with a
// constant trip a multiple of c (1 < c < trip), it becomes two, v = vo * c + vi, and v / c,
// v % c become vo and vi. The range loop is left alone (its bounds are the ABI's). The
// iterations keep their order: the same bits wherever reductions are ordered (deterministic
// mode; elsewhere LLVM may vectorise a split row reduction into a tree sum, as it may any loop).
#pragma once

#include "codegen/kernel_ir.hpp"

namespace tessera::kir {

void split_loops_at_divisors(Kernel& kernel);

}  // namespace tessera::kir
