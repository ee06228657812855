// A matrix of 16-bit elements (bf16 bits) transposed, for the bf16 GEMM's packing
// (backend/cpu/short_gemm.cpp): an operand stored transposed (an attention product's P^T, a
// weight gradient's activations) is turned into rows before LIBXSMM reads it. Element by element
// that copy cost about 2 cycles an element on this project's Zen 4 VM, twice the small batched
// GEMM it fed; 32 x 32 tiles transposed inside AVX-512 registers cost a fraction of that.
#pragma once

#include <cstdint>

namespace tessera {

// to[c * to_stride + r] = from[r * from_stride + c] for r < rows, c < cols.
void transpose_16bit(const uint16_t* from, int64_t rows, int64_t cols, int64_t from_stride, uint16_t* to, int64_t to_stride);

}  // namespace tessera
