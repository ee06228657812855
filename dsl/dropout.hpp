// Dropout whose mask depends only on the seed and each element's GLOBAL index (Philox, as every
// random op here), so a model drops the same elements on every mesh and layout; PyTorch's
// masks change with the sharding.
#pragma once

#include <cstdint>

#include "dsl/ops.hpp"

namespace tessera {

// Each element zeroed with probability `rate`, the others scaled by 1 / (1 - rate). rate must
// lie in [0, 1) (Error otherwise); 0 returns x.
Tensor dropout(const Tensor& x, double rate, uint64_t seed, Loc where = Loc::current());

}  // namespace tessera
