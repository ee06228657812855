// The CUDA driver API, loaded at run time: libcuda.so.1 comes with the GPU's driver, never with
// the toolkit, so it is dlopen'ed (never linked) and a machine without a GPU simply has none.
// Entry points keep their cuda.h names with a trailing underscore (driver.cuInit_), typed from
// cuda.h's own declarations, and resolve to the versioned symbols that cuda.h maps them to
// (cuMemcpyHtoDAsync -> cuMemcpyHtoDAsync_v2).
#pragma once

#include <cuda.h>

#include <string>

namespace tessera {

#define TESSERA_CUDA_DRIVER_FUNCTIONS(X)                                                                \
  X(cuInit) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount) X(cuDeviceGet)                    \
  X(cuDeviceGetAttribute) X(cuDeviceGetName) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent)             \
  X(cuStreamCreate) X(cuStreamSynchronize) X(cuDeviceGetDefaultMemPool) X(cuMemPoolSetAttribute)        \
  X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync)  \
  X(cuMemsetD8Async) X(cuMemsetD16Async) X(cuMemsetD32Async) X(cuModuleLoadDataEx) X(cuModuleGetFunction) \
  X(cuLaunchKernel) X(cuEventCreate) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime)        \
  X(cuEventDestroy) X(cuStreamWaitEvent)

struct CudaDriver {
#define TESSERA_CUDA_DECLARE(fn) decltype(&fn) fn##_ = nullptr;
  TESSERA_CUDA_DRIVER_FUNCTIONS(TESSERA_CUDA_DECLARE)
#undef TESSERA_CUDA_DECLARE

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
