// cuBLAS, loaded at run time from the machine's CUDA libraries (libcublas.so.13 or .12, found on
// the library path) like the driver: nothing CUDA is linked, so one build runs with or without
// GPUs. Entry points are declared by backend/cuda/cuda_api.hpp.
#pragma once

#include "backend/cuda/cuda_api.hpp"

namespace tessera {

struct CublasLibrary {
  TESSERA_CUBLAS_FUNCTIONS(TESSERA_DECLARE_API_MEMBER)

  // Throws DeviceError "cuBLAS: <what> failed: <status>" unless `status` is success.
  void check(cublasStatus_t status, const char* what) const;
};

// The loaded library, or a DeviceError naming what is missing.
const CublasLibrary& cublas();

}  // namespace tessera
