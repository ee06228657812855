// The backends this build compiled, registered with jit/backend_registry.hpp on first use.
#include "backend/cpu/cpu_backend.hpp"
#include "jit/backend_registry.hpp"
#include "tessera_config.hpp"
#if TESSERA_HAVE_CUDA_BACKEND
#include "backend/cuda/cuda_backend.hpp"
#endif

namespace tessera {

void register_builtin_backends() {
  register_cpu_backend();
#if TESSERA_HAVE_CUDA_BACKEND
  register_cuda_backend();
#endif
}

}  // namespace tessera
