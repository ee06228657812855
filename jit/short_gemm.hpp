#pragma once
// Row-major f32 GEMM for products with few rows (a batch of activations times a weight matrix),
// through LIBXSMM's JIT kernels that read the weight where it lies. OpenBLAS packs the whole
// weight on every call; with 64 or 128 rows that copy costs 15-25% of the product, and it does
// not shrink when data parallelism halves the rows.
#include <cstdint>

namespace tessera {

// out[m, n] = op(a)[m, k] x b[k, n], op = transpose when trans_a (a then holds [k, m]).
// Returns false, doing nothing, when the shape is outside what it handles better than BLAS
// (more than kShortGemmMaxRows rows, b transposed, LIBXSMM absent from the build), in
// TESSERA_DETERMINISTIC=1 runs, and with TESSERA_SHORT_GEMM=0 (for comparisons).
bool short_sgemm(int64_t m, int64_t n, int64_t k, const float* a, bool trans_a, const float* b, bool trans_b,
                 float* out);

inline constexpr int64_t kShortGemmMaxRows = 128;

}  // namespace tessera
