// The CUDA backend: kernels rendered to CUDA C (codegen/cuda_renderer.hpp) and compiled by NVRTC
// (backend/cuda/nvrtc_compiler.hpp), GEMMs by cuBLAS, collectives of virtual GPUs on one GPU by
// device kernels (backend/cuda/cuda_group_communicator.hpp), on CudaDevices
// (backend/cuda/cuda_device.hpp). The driver, NVRTC and cuBLAS are loaded at run time
// (backend/cuda/cuda_api.hpp), so it builds and registers on machines with no CUDA at all and
// a GPU mesh there is a DeviceError naming what is missing.
#pragma once

namespace tessera {

// Registers it with jit/backend_registry.hpp.
void register_cuda_backend();

}  // namespace tessera
