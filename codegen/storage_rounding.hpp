// The rounding of a value to a 16-bit float storage type, written in kernel IR (integer bit
// operations on the f32 value, no float tricks a fast-math renderer could fold away). Values of
// bf16/f16 dtypes are computed in f32; each op's result is rounded as if it had been stored, so
// a fused chain gives the bits of the same ops run one at a time (and of the reference), on
// every target: the renderers see only ordinary IR. Matches dsl/dtype.cpp's conversions
// (round to nearest even, overflow to infinity, f16 subnormals).
#pragma once

#include "codegen/kernel_ir.hpp"

namespace tessera::kir {

// `x` (F32) rounded to bf16 or f16 and back; other storage types leave it as it is.
Expr round_to_storage(Expr x, Type storage);

}  // namespace tessera::kir
