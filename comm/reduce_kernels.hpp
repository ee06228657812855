// Elementwise reductions used by every collective backend. Inputs are combined in rank order
// (inputs[0] op inputs[1] op ...), so every rank computes bitwise the same result.
#pragma once

#include <cstdint>

#include "dsl/dtype.hpp"
#include "dsl/placement.hpp"

namespace tessera {

// out[i] = inputs[0][i] op ... op inputs[n_inputs-1][i]; Avg divides the sum by n_inputs.
// `out` may alias any input.
void reduce_many(void* out, const void* const* inputs, int n_inputs, int64_t count, DType dtype, ReduceOp op);

// The same result written to every one of `n_outs` outputs (an in-process all-reduce writes
// each reduced slice straight into every rank's buffer). Outputs may alias inputs.
void reduce_many_to(void* const* outs, int n_outs, const void* const* inputs, int n_inputs, int64_t count,
                    DType dtype, ReduceOp op);

// The value a rank holds for an element that contributes nothing: 0 for sum, 1 for product.
double reduce_identity(ReduceOp op);

}  // namespace tessera
