// Loop splitting at the divisors a loop's index arithmetic uses.
//
// A reshape that merges axes reads its input at v / c and v % c (c: the inner axis's extent).
// Inside a loop over v that costs a division per element and hides the contiguous runs from
// the vectoriser: a head-merging permute ([B, H, T, E] -> [B*T, H*E]) copied or column-reduced
// at a third of the speed of a contiguous read. When a serial loop's constant trip count is a
// multiple of c, the loop becomes two, v = vo * c + vi, and v / c, v % c become vo and vi.
// The iterations keep their order, so results are bitwise the same.
#pragma once

#include "codegen/kernel_ir.hpp"

namespace tessera::kir {

void split_loops_at_divisors(Kernel& kernel);

}  // namespace tessera::kir
