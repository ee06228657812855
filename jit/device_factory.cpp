#include "jit/device_factory.hpp"

#include "dsl/device_name.hpp"
#include "dsl/error.hpp"
#include "jit/cpu_device.hpp"
#include "tessera_config.hpp"
#if TESSERA_HAVE_NVRTC
#include "jit/cuda_device.hpp"
#endif

namespace tessera {

std::unique_ptr<Device> make_device(const std::string& name, int64_t worker, int64_t devices_in_run, bool sets_blas_threads) {
  const DeviceName parsed = DeviceName::parse(name);
  if (parsed.kind() == DeviceKind::GPU) {
#if TESSERA_HAVE_NVRTC
    return std::make_unique<CudaDevice>(name, parsed.index);
#else
    throw DeviceError("device " + name + ": this build of Tessera has no CUDA backend (NVRTC was not found at build time)");
#endif
  }
  return std::make_unique<CpuDevice>(name, worker, devices_in_run, sets_blas_threads);
}

}  // namespace tessera
