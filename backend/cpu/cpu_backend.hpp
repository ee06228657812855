// The CPU backend: kernels compiled by LLVM ORC (backend/cpu/orc_engine.hpp), GEMMs by OpenBLAS
// and LIBXSMM (backend/cpu/cpu_gemm.hpp), fused attention (backend/cpu/cpu_attention.hpp), on
// CpuDevices (backend/cpu/cpu_device.hpp). Any number of virtual CPU devices share the cores.
#pragma once

namespace tessera {

// Registers it with jit/backend_registry.hpp.
void register_cpu_backend();

}  // namespace tessera
