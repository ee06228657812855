// cuBLAS, loaded at run time from the machine's CUDA libraries (libcublas.so.13, found on the
// library path) like the driver: nothing CUDA is linked, so one build runs with or without GPUs.
#pragma once

#include <cublas_api.h>

#include <string>

namespace tessera {

struct CublasLibrary {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t) = nullptr;
  cublasStatus_t (*gemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                         const void*, const void*, cudaDataType, int, long long, const void*,
                                         cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                         long long, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;

  // Throws DeviceError "cuBLAS: <what> failed: <status>" unless `status` is success.
  void check(cublasStatus_t status, const char* what) const;
};

// The loaded library, or a DeviceError naming what is missing.
const CublasLibrary& cublas();

}  // namespace tessera
