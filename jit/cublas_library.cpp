#include "jit/cublas_library.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include "dsl/error.hpp"

namespace tessera {
namespace {

struct Loaded {
  CublasLibrary library;
  std::string why;  // empty when loaded
};

template <class Fn>
bool resolve(void* handle, const char* symbol, Fn& fn, std::string& why) {
  fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (!fn) why = fmt::format("cuBLAS lacks {}", symbol);
  return fn != nullptr;
}

Loaded load() {
  Loaded out;
  void* handle = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
  if (!handle) handle = dlopen("libcublas.so.12", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    out.why = fmt::format("cuBLAS not found (dlopen libcublas.so.13: {})", dlerror());
    return out;
  }
  CublasLibrary& l = out.library;
  (void)(resolve(handle, "cublasCreate_v2", l.create, out.why) && resolve(handle, "cublasSetStream_v2", l.set_stream, out.why) &&
         resolve(handle, "cublasSetMathMode", l.set_math_mode, out.why) &&
         resolve(handle, "cublasGemmStridedBatchedEx", l.gemm_strided_batched, out.why));
  return out;
}

}  // namespace

void CublasLibrary::check(cublasStatus_t status, const char* what) const {
  if (status != CUBLAS_STATUS_SUCCESS) throw DeviceError(fmt::format("cuBLAS: {} failed: status {}", what, int(status)));
}

const CublasLibrary& cublas() {
  static const Loaded* loaded = new Loaded(load());
  if (!loaded->why.empty()) throw DeviceError(loaded->why);
  return loaded->library;
}

}  // namespace tessera
