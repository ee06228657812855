// GEMM on host memory: short f32 products by short_gemm, the rest by OpenBLAS, and, under
// TESSERA_DETERMINISTIC=1, a fixed summation order whatever the shapes (see cpu_gemm.cpp).
#pragma once

#include "dsl/array.hpp"

namespace tessera {

// Row-major batched GEMM: out[b] = op(a[b]) x op(b[b]), op = transpose when the flag is set (the
// buffer then holds the operand's transpose). OpenBLAS uses the threads it was last given.
void host_gemm(const Array& a, bool trans_a, const Array& b, bool trans_b, Array& out);

}  // namespace tessera
