// Grouped GEMMs on host memory (dsl/grouped_matmul.hpp's primitives): one GEMM per group of
// consecutive rows, each through host_gemm (LIBXSMM or OpenBLAS, bf16 and the fixed summation
// order included), so a group costs what one GEMM of its size costs. The group bounds are read
// from the ends buffer when the call runs.
#pragma once

#include <cstdint>

#include "dsl/array.hpp"
#include "backend/cpu/short_gemm.hpp"

namespace tessera {

// out [n, F] = x [n, K] rows times w[e] [K, F] for the group e each row is in; rows in no group
// are zero. x's rows are global rows [row_offset, row_offset + n); ends [E] (int64) are global
// running totals: group e is rows [ends[e - 1], ends[e]).
void grouped_gemm(const Array& x, const Array& w, const Array& ends, int64_t row_offset, Array& out, bool ordered, int parts = 1,
                  const PartRunner& run = {});

// out [E, K, F]: out[e] = x_e^T dy_e over the rows of group e this device holds (x [n, K], dy
// [n, F], the same rows); zero for a group with none.
void grouped_weight_grad_gemm(const Array& x, const Array& dy, const Array& ends, int64_t row_offset, Array& out, bool ordered,
                              int parts = 1, const PartRunner& run = {});

}  // namespace tessera
