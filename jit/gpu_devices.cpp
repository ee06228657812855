// gpu_devices() (dsl/mesh.hpp): the GPU devices of this process, from the CUDA driver where the
// CUDA backend was built (jit/virtual_gpu.hpp), none elsewhere.
#include "dsl/mesh.hpp"
#include "dsl/error.hpp"
#include "tessera_config.hpp"
#if TESSERA_HAVE_NVRTC
#include "jit/virtual_gpu.hpp"
#endif

namespace tessera {

std::vector<std::string> gpu_devices(int n) {
  if (n < 0) throw DeviceError("gpu_devices(" + std::to_string(n) + "): the count cannot be negative");
  int64_t count = 0;
#if TESSERA_HAVE_NVRTC
  if (n > 0) ensure_virtual_gpus(n);
  count = n > 0 ? n : virtual_gpu_count();
#else
  if (n > 0)
    throw DeviceError("gpu_devices(" + std::to_string(n) + "): this build of Tessera has no CUDA backend (NVRTC was not found at build time)");
#endif
  std::vector<std::string> out;
  for (int64_t i = 0; i < count; ++i) out.push_back("GPU:" + std::to_string(i));
  return out;
}

}  // namespace tessera
