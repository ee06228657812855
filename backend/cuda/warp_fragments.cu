// A warp's operands of a tensor-core product (warp_mma.cu) read from 16-bit tiles in shared
// memory, and the product itself by the data's dtype: the fragment layout of mma.m16n8k16 (lane
// 4 g + t holds A's rows g and g + 8 at columns 2t, 2t + 1, 2t + 8 and 2t + 9; B's column g at
// those rows), for every kernel that runs on tensor cores (flash_attention_mma.cu,
// grouped_gemm_mma.cu). After storage_types.cu; NVRTC gets warp_mma.cu before it, the tests
// test/cuda_emulation.hpp.

namespace tsr_mma {

using tsr_storage::Bf16;
using tsr_storage::F16;

__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], Bf16) {
  tsr_mma_m16n8k16_bf16(d, a, b);
}
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], F16) {
  tsr_mma_m16n8k16_f16(d, a, b);
}
// Two values rounded to the data's 16 bits, the first in the low half.
__device__ __forceinline__ uint32_t pack(float low, float high, Bf16) {
  return uint32_t(tsr_f32_to_bf16(low)) | uint32_t(tsr_f32_to_bf16(high)) << 16;
}
__device__ __forceinline__ uint32_t pack(float low, float high, F16) {
  return uint32_t(tsr_f32_to_f16(low)) | uint32_t(tsr_f32_to_f16(high)) << 16;
}

// The 32-bit word of elements (row, column) and (row, column + 1); column is even.
__device__ __forceinline__ uint32_t word_at(const uint16_t* tile, int ld, int row, int column) {
  return *reinterpret_cast<const uint32_t*>(tile + row * ld + column);
}
// A's fragment of the 16 x 16 block at (row0, k0) of a row-major tile.
__device__ __forceinline__ void a_fragment(uint32_t (&a)[4], const uint16_t* tile, int ld, int row0, int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  a[0] = word_at(tile, ld, row0 + g, k0 + 2 * t);
  a[1] = word_at(tile, ld, row0 + g + 8, k0 + 2 * t);
  a[2] = word_at(tile, ld, row0 + g, k0 + 2 * t + 8);
  a[3] = word_at(tile, ld, row0 + g + 8, k0 + 2 * t + 8);
}
// B's fragment where B[k][n] = tile[n0 + n][k0 + k]: another tile's rows as B's columns (k^T, v^T).
__device__ __forceinline__ void b_fragment_of_rows(uint32_t (&b)[2], const uint16_t* tile, int ld, int n0, int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  b[0] = word_at(tile, ld, n0 + g, k0 + 2 * t);
  b[1] = word_at(tile, ld, n0 + g, k0 + 2 * t + 8);
}
// B's fragment where B[k][n] = tile[k0 + k][n0 + n]: the tile itself (v, d_out, k, q).
__device__ __forceinline__ void b_fragment_of_columns(uint32_t (&b)[2], const uint16_t* tile, int ld, int k0, int n0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const uint16_t* at = tile + (k0 + 2 * t) * ld + n0 + g;
  b[0] = uint32_t(at[0]) | uint32_t(at[ld]) << 16;
  b[1] = uint32_t(at[8 * ld]) | uint32_t(at[9 * ld]) << 16;
}

}  // namespace tsr_mma
