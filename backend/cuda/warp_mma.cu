// A warp's matrix multiply-accumulate on tensor cores: D = A B + D for one 16 x 16 tile of A
// (bf16 or f16, row-major) and one 16 x 8 tile of B (column-major), with f32 sums, every lane of
// the warp holding its fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16": lane 4 g + t
// holds A's rows g and g + 8 at columns 2t, 2t + 1 and 2t + 8, 2t + 9; B's column g at rows 2t,
// 2t + 1 and 2t + 8, 2t + 9; D's rows g and g + 8 at columns 2t and 2t + 1; each 32-bit register
// two 16-bit elements, the lower column or row in the low half). Compute capability 8.0 and later.
// test/cuda_emulation.hpp gives the same two functions on the CPU, from the same fragments, for
// the kernels that call them (flash_attention_mma.cu).

static __device__ __forceinline__ void tsr_mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

static __device__ __forceinline__ void tsr_mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
