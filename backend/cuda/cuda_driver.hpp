// The CUDA driver API, loaded at run time: libcuda.so.1 comes with the GPU's driver, never with
// the toolkit, so it is dlopen'ed (never linked) and a machine without a GPU simply has none.
// Entry points are members named as in cuda.h (driver.cuInit), declared by
// backend/cuda/cuda_api.hpp.
#pragma once

#include <string>

#include "backend/cuda/cuda_api.hpp"

namespace tessera {

struct CudaDriver {
  TESSERA_CUDA_DRIVER_FUNCTIONS(TESSERA_DECLARE_API_MEMBER)

  // The process's driver, loaded and initialised on first use; nullptr where there is none
  // (no libcuda.so.1, or cuInit failed: why_unavailable() says which).
  static const CudaDriver* get();
  static std::string why_unavailable();

  // Throws DeviceError "CUDA: <what> failed: <name> (<description>)" unless `result` is success.
  void check(CUresult result, const char* what) const;
};

// The driver, or a DeviceError naming why there is none.
const CudaDriver& cuda_driver();

}  // namespace tessera
