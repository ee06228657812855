#include "backend/cuda/library_kernel_source.hpp"

#include <fmt/format.h>

#include "backend/cuda/storage_types_source.hpp"
#include "codegen/cuda_prelude.hpp"
#include "dsl/error.hpp"

namespace tessera {

std::string library_kernel_preamble() {
  std::string source(cuda_prelude());
  source +=
      "\nextern __shared__ double tsr_dynamic_shared[];\n"
      "static __device__ __forceinline__ unsigned char* tsr_shared_memory() { return reinterpret_cast<unsigned char*>(tsr_dynamic_shared); }\n";
  source += kStorageTypesCudaSource;
  return source;
}

const char* storage_type_name(DType dtype, std::string_view kernel) {
  switch (dtype) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::bf16: return "tsr_storage::Bf16";
    case DType::f16: return "tsr_storage::F16";
    default:
      throw DeviceError(fmt::format("{} on a GPU: {} is not supported ({}, {}, {} or {})", kernel, dtype_name(dtype), dtype_name(DType::f32),
                                    dtype_name(DType::f64), dtype_name(DType::bf16), dtype_name(DType::f16)));
  }
}

}  // namespace tessera
