#include "codegen/cuda_prelude.hpp"

namespace tessera {

std::string_view cuda_prelude() {
  return R"CUDA(// Tessera kernel prelude.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

// bf16 and f16 are storage only: loaded as f32. Kernels store values their lowering already
// rounded (codegen/storage_rounding.hpp), whose bits tsr_bf16_bits and tsr_f16_bits only
// narrow; tsr_f32_to_bf16 and tsr_f32_to_f16 round to nearest even themselves for the
// collective reduce kernels (backend/cuda/cuda_collective_kernels.cpp), which are written
// here, not in kernel IR. All in integer code, so the bits match dsl/dtype.cpp and the CPU
// renderer whatever the GPU's conversion modes; a NaN stays a quiet NaN.
static __device__ __forceinline__ float tsr_bf16_to_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

static __device__ __forceinline__ uint16_t tsr_bf16_bits(float f) {
  const uint32_t bits = __float_as_uint(f);
  return (uint16_t)(f != f ? (bits >> 16) | 0x40u : bits >> 16);
}

static __device__ __forceinline__ uint16_t tsr_f16_bits(float value) {
  const uint32_t bits = __float_as_uint(value);
  const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits >= 0x7f800000u) return sign | (abs_bits > 0x7f800000u ? 0x7e00u : 0x7c00u);
  // Zero or subnormal: a whole number of 2^-24 below 1024, exactly.
  if (abs_bits < 0x38800000u) return sign | (uint16_t)(__uint_as_float(abs_bits) * 16777216.0f);
  return sign | (uint16_t)((abs_bits - (112u << 23)) >> 13);
}

static __device__ __forceinline__ uint16_t tsr_f32_to_bf16(float f) {
  const uint32_t bits = __float_as_uint(f);
  if (f != f) return (uint16_t)((bits >> 16) | 0x40u);  // stays a quiet NaN
  return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

static __device__ __forceinline__ float tsr_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return __uint_as_float(sign | 0x7f800000u | mantissa << 13);
  if (exponent != 0u) return __uint_as_float(sign | (exponent + 112u) << 23 | mantissa << 13);
  // Zero or subnormal: mantissa * 2^-24, exact in f32.
  return __uint_as_float(sign | __float_as_uint((float)mantissa * 5.9604644775390625e-8f));
}

static __device__ __forceinline__ uint16_t tsr_f32_to_f16(float value) {
  const uint32_t bits = __float_as_uint(value);
  const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits >= 0x7f800000u) return sign | (abs_bits > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // rounds past the largest half: inf
  if (abs_bits < 0x38800000u) {                        // below the smallest normal half
    if (abs_bits < 0x33000000u) return sign;           // rounds to zero
    const uint32_t exponent = abs_bits >> 23, mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exponent;
    uint32_t half = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (half & 1u))) ++half;
    return sign | (uint16_t)half;
  }
  const uint32_t rounded = abs_bits + 0xfffu + ((abs_bits >> 13) & 1u);
  return sign | (uint16_t)((rounded - (112u << 23)) >> 13);
}

// llvm.maximum / llvm.minimum: a NaN operand gives NaN (numpy), and +0 is above -0. CUDA's
// fmaxf/fminf would drop the NaN.
static __device__ __forceinline__ float tsr_maximum(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return (__float_as_uint(a) & 0x80000000u) ? b : a;
  return a > b ? a : b;
}
static __device__ __forceinline__ float tsr_minimum(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return (__float_as_uint(a) & 0x80000000u) ? a : b;
  return a < b ? a : b;
}
static __device__ __forceinline__ double tsr_maximum(double a, double b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return __double_as_longlong(a) < 0 ? b : a;
  return a > b ? a : b;
}
static __device__ __forceinline__ double tsr_minimum(double a, double b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return __double_as_longlong(a) < 0 ? a : b;
  return a < b ? a : b;
}

// Integer division truncates like the CPU's. Lowering already guards x / 0 and x / -1 (the
// CPU's divide traps on them); here they give numpy's results too (x / 0 = 0, x % 0 = 0,
// INT_MIN / -1 wraps) rather than whatever the GPU's division sequence leaves.
static __device__ __forceinline__ int32_t tsr_div(int32_t a, int32_t b) {
  return b == 0 ? 0 : b == -1 ? (int32_t)(0u - (uint32_t)a) : a / b;
}
static __device__ __forceinline__ int64_t tsr_div(int64_t a, int64_t b) {
  return b == 0 ? 0 : b == -1 ? (int64_t)(0ull - (uint64_t)a) : a / b;
}
static __device__ __forceinline__ uint8_t tsr_div(uint8_t a, uint8_t b) { return b == 0 ? 0 : (uint8_t)(a / b); }
static __device__ __forceinline__ int32_t tsr_rem(int32_t a, int32_t b) { return b == 0 || b == -1 ? 0 : a % b; }
static __device__ __forceinline__ int64_t tsr_rem(int64_t a, int64_t b) { return b == 0 || b == -1 ? 0 : a % b; }
static __device__ __forceinline__ uint8_t tsr_rem(uint8_t a, uint8_t b) { return b == 0 ? 0 : (uint8_t)(a % b); }
)CUDA";
}

}  // namespace tessera
