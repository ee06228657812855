// FSDP2's MixedPrecisionPolicy: what a module computes with, what its gradients are summed over
// devices in, what its outputs are. Installed by fully_shard and apply_mixed_precision
// (nn/mixed_precision.hpp).
#pragma once

#include "dsl/dtype.hpp"

namespace tessera {

struct MixedPrecisionPolicy {
  DType param_dtype = DType::f32;   // what forward computes with: each floating parameter cast to it
  // The dtype every sum over devices is done in: gradients over dp (wire and sums), and the
  // tensor-parallel reductions the parallel styles place (row-parallel outputs, column-parallel
  // input gradients), which PyTorch's policy leaves in param_dtype.
  DType reduce_dtype = DType::f32;
  DType output_dtype = DType::f32;  // the module's floating outputs, cast to it
  bool operator==(const MixedPrecisionPolicy&) const = default;
};

// FSDP2's usual bf16 policy: parameters and compute in bf16, gradient sums and outputs in f32
// (`samples/gpt --precision bf16`, `samples/plan --precision bf16`).
inline constexpr MixedPrecisionPolicy kBf16MixedPrecision{DType::bf16, DType::f32, DType::f32};

}  // namespace tessera
