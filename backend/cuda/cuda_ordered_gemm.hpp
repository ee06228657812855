// GEMM in a fixed summation order on a GPU, for TESSERA_DETERMINISTIC=1: one thread per output
// element sums its products in k order, each product rounded before its add (no fused
// multiply-add), which is backend/cpu/cpu_gemm's ordered_gemm: the same bits on every mesh, and the
// CPU's. cuBLAS picks algorithms (split-k among them) by shape, so a sharded product would sum
// in another order than the whole one.
#pragma once

#include "backend/cuda/cuda_api.hpp"

#include "dsl/array.hpp"

namespace tessera {

class VirtualGpu;

// Row-major batched out = op(a) x op(b) (f32 or f64) queued on the device's stream.
void ordered_gemm_on_gpu(VirtualGpu& gpu, const Array& a, bool trans_a, const Array& b, bool trans_b, Array& out,
                         int64_t m, int64_t n, int64_t k, int64_t batch);

}  // namespace tessera
