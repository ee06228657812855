#include "jit/cuda_driver.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include "dsl/error.hpp"

namespace tessera {
namespace {

#define TESSERA_STRINGIFY_EXPANDED(x) TESSERA_STRINGIFY(x)
#define TESSERA_STRINGIFY(x) #x

struct Loaded {
  CudaDriver driver;
  bool ok = false;
  std::string why;
};

Loaded load() {
  Loaded out;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    out.why = fmt::format("no CUDA driver (dlopen libcuda.so.1: {})", dlerror());
    return out;
  }
  // The expanded name: the versioned symbol cuda.h declares under the plain one.
#define TESSERA_CUDA_RESOLVE(fn)                                                              \
  out.driver.fn##_ = reinterpret_cast<decltype(&fn)>(dlsym(library, TESSERA_STRINGIFY_EXPANDED(fn))); \
  if (!out.driver.fn##_) {                                                                    \
    out.why = "the CUDA driver lacks " TESSERA_STRINGIFY_EXPANDED(fn) " (driver older than CUDA 12)"; \
    return out;                                                                               \
  }
  TESSERA_CUDA_DRIVER_FUNCTIONS(TESSERA_CUDA_RESOLVE)
#undef TESSERA_CUDA_RESOLVE
  if (CUresult r = out.driver.cuInit_(0); r != CUDA_SUCCESS) {
    const char* name = nullptr;
    out.driver.cuGetErrorName_(r, &name);
    out.why = fmt::format("cuInit failed: {}", name ? name : "unknown error");
    return out;
  }
  out.ok = true;
  return out;
}

const Loaded& loaded() {
  static const Loaded* instance = new Loaded(load());  // lives until exit: buffers are freed at exit
  return *instance;
}

}  // namespace

const CudaDriver* CudaDriver::get() { return loaded().ok ? &loaded().driver : nullptr; }

std::string CudaDriver::why_unavailable() { return loaded().why; }

void CudaDriver::check(CUresult result, const char* what) const {
  if (result == CUDA_SUCCESS) return;
  const char *name = nullptr, *text = nullptr;
  cuGetErrorName_(result, &name);
  cuGetErrorString_(result, &text);
  throw DeviceError(fmt::format("CUDA: {} failed: {} ({})", what, name ? name : "unknown error", text ? text : "no description"));
}

const CudaDriver& cuda_driver() {
  if (const CudaDriver* driver = CudaDriver::get()) return *driver;
  throw DeviceError("CUDA: " + CudaDriver::why_unavailable());
}

}  // namespace tessera
