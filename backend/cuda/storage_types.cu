// The element types the hand-written CUDA library kernels (flash_attention.cu, grouped_gemm.cu)
// read and write: bf16 and f16 as 16-bit patterns converted by the kernel prelude's functions
// (codegen/cuda_prelude.cpp), f32 and f64 as themselves; each summed in SumType (f32, f64 for
// f64). Their host code puts this file before each kernel's source, as the tests include it.
// Loops over a thread's registers unroll on the GPU; the emulation defines it away.
#ifndef TSR_UNROLL
#define TSR_UNROLL _Pragma("unroll")
#endif

namespace tsr_storage {

struct Bf16 { uint16_t bits; };
struct F16 { uint16_t bits; };

template <class T> struct SumType { typedef float type; };
template <> struct SumType<double> { typedef double type; };

__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ double widen(double x) { return x; }
__device__ __forceinline__ float widen(Bf16 x) { return tsr_bf16_to_f32(x.bits); }
__device__ __forceinline__ float widen(F16 x) { return tsr_f16_to_f32(x.bits); }
__device__ __forceinline__ void store(float* to, float x) { *to = x; }
__device__ __forceinline__ void store(double* to, double x) { *to = x; }
__device__ __forceinline__ void store(Bf16* to, float x) { to->bits = tsr_f32_to_bf16(x); }
__device__ __forceinline__ void store(F16* to, float x) { to->bits = tsr_f32_to_f16(x); }

}  // namespace tsr_storage
