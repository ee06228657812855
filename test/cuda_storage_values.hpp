// Values of the CUDA library kernels' element types (backend/cuda/storage_types.cu, included
// before this header) for the tests that run those kernels through test/cuda_emulation.hpp.
#pragma once

#include <type_traits>

#include "dsl/dtype.hpp"

namespace tessera::cuda_emulation {

// `x` in T (bf16 and f16 rounded to nearest even, as dsl/dtype.hpp rounds).
template <class T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, tsr_storage::Bf16>) return {float_to_bf16(float(x))};
  else if constexpr (std::is_same_v<T, tsr_storage::F16>) return {float_to_f16(float(x))};
  else return T(x);
}
template <class T>
double to_double(T x) {
  if constexpr (std::is_same_v<T, tsr_storage::Bf16>) return bf16_to_float(x.bits);
  else if constexpr (std::is_same_v<T, tsr_storage::F16>) return f16_to_float(x.bits);
  else return double(x);
}
template <class T>
constexpr DType dtype_of_element() {
  if constexpr (std::is_same_v<T, tsr_storage::Bf16>) return DType::bf16;
  else if constexpr (std::is_same_v<T, tsr_storage::F16>) return DType::f16;
  else if constexpr (std::is_same_v<T, double>) return DType::f64;
  else return DType::f32;
}

}  // namespace tessera::cuda_emulation
