#include "backend/cuda/cublas_library.hpp"

#include <fmt/format.h>

#include <string>

#include "backend/cuda/runtime_library.hpp"
#include "dsl/error.hpp"

namespace tessera {
namespace {

LoadedLibrary<CublasLibrary> load_cublas() {
  LoadedLibrary<CublasLibrary> out;
  void* handle = open_runtime_library({"libcublas.so.13", "libcublas.so.12", "libcublas.so.11"}, out.why);
  if (!handle) {
    out.why = "cuBLAS not found: " + out.why;
    return out;
  }
  TESSERA_RESOLVE_API(TESSERA_CUBLAS_FUNCTIONS, out.table, handle, "cuBLAS", out.why);
  return out;
}

}  // namespace

void CublasLibrary::check(cublasStatus_t status, const char* what) const {
  if (status != CUBLAS_STATUS_SUCCESS) throw DeviceError(fmt::format("cuBLAS: {} failed: status {}", what, int(status)));
}

const CublasLibrary& cublas() {
  static const auto* loaded = new LoadedLibrary<CublasLibrary>(load_cublas());
  if (!loaded->why.empty()) throw DeviceError(loaded->why);
  return loaded->table;
}

}  // namespace tessera
