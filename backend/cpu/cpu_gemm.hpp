// GEMM on host memory: f32 products by LIBXSMM (short_gemm.hpp), the rest by OpenBLAS, and, for
// deterministic targets (ir/target.hpp), a fixed summation order whatever the shapes (see cpu_gemm.cpp).
// f32, f64 and bf16 operands (bf16: f32 sums, rounded once into the bf16 output).
#pragma once

#include "dsl/array.hpp"
#include "backend/cpu/short_gemm.hpp"

namespace tessera {

// Row-major batched GEMM: out[b] = op(a[b]) x op(b[b]), op = transpose when the flag is set (the
// buffer then holds the operand's transpose). `ordered`: the fixed summation order. The work is
// shared among `parts` parts run by `run` (LIBXSMM's tiles, or single-threaded BLAS calls on
// rows).
void host_gemm(const Array& a, bool trans_a, const Array& b, bool trans_b, Array& out, bool ordered, int parts = 1,
               const PartRunner& run = {});

}  // namespace tessera
