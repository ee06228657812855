// The Device behind a mesh device name: "CPU:i" a CpuDevice, "GPU:i" a CudaDevice (where the
// CUDA backend was built; elsewhere a DeviceError, though meshes already refuse GPU names there
// because gpu_devices() is empty).
#pragma once

#include <memory>
#include <string>

#include "jit/device.hpp"

namespace tessera {

// `worker`, `devices_in_run` and `sets_blas_threads` are the CpuDevice's (jit/cpu_device.hpp).
std::unique_ptr<Device> make_device(const std::string& name, int64_t worker, int64_t devices_in_run, bool sets_blas_threads);

}  // namespace tessera
