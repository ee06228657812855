// What every hand-written CUDA library kernel's source (flash_attention.cu, grouped_gemm.cu)
// starts with, and how its host code names the element types those kernels are instantiated for.
#pragma once

#include <string>
#include <string_view>

#include "dsl/dtype.hpp"

namespace tessera {

// The kernel prelude (codegen/cuda_prelude.hpp), the dynamic shared memory the kernels ask for
// (its size is the launch's), and storage_types.cu; the kernel's own source follows.
std::string library_kernel_preamble();

// storage_types.cu's name of `dtype` ("float", "double", "tsr_storage::Bf16",
// "tsr_storage::F16"); a DeviceError naming `kernel` ("flash attention") for any other dtype.
const char* storage_type_name(DType dtype, std::string_view kernel);

}  // namespace tessera
