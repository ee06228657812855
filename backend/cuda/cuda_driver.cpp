#include "backend/cuda/cuda_driver.hpp"

#include <fmt/format.h>

#include "backend/cuda/runtime_library.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

LoadedLibrary<CudaDriver> load_cuda_driver() {
  LoadedLibrary<CudaDriver> out;
  void* library = open_runtime_library({"libcuda.so.1"}, out.why);
  if (!library) {
    out.why = "no CUDA driver: " + out.why;
    return out;
  }
  if (!TESSERA_RESOLVE_API(TESSERA_CUDA_DRIVER_FUNCTIONS, out.table, library, "the CUDA driver", out.why)) return out;
  if (CUresult r = out.table.cuInit(0); r != CUDA_SUCCESS) {
    const char* name = nullptr;
    out.table.cuGetErrorName(r, &name);
    out.why = fmt::format("cuInit failed: {}", name ? name : "unknown error");
  }
  return out;
}

const LoadedLibrary<CudaDriver>& loaded_cuda_driver() {
  static const auto* instance = new LoadedLibrary<CudaDriver>(load_cuda_driver());  // lives until exit: buffers are freed at exit
  return *instance;
}

}  // namespace

const CudaDriver* CudaDriver::get() { return loaded_cuda_driver().why.empty() ? &loaded_cuda_driver().table : nullptr; }

std::string CudaDriver::why_unavailable() { return loaded_cuda_driver().why; }

void CudaDriver::check(CUresult result, const char* what) const {
  if (result == CUDA_SUCCESS) return;
  const char *name = nullptr, *text = nullptr;
  cuGetErrorName(result, &name);
  cuGetErrorString(result, &text);
  throw DeviceError(fmt::format("CUDA: {} failed: {} ({})", what, name ? name : "unknown error", text ? text : "no description"));
}

const CudaDriver& cuda_driver() {
  if (const CudaDriver* driver = CudaDriver::get()) return *driver;
  throw DeviceError("CUDA: " + CudaDriver::why_unavailable());
}

}  // namespace tessera
