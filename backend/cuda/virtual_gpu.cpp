#include "backend/cuda/virtual_gpu.hpp"

#include <fmt/format.h>

#include <map>
#include <memory>

#include "dsl/error.hpp"
#include "backend/cuda/cublas_library.hpp"
#include "backend/cuda/cuda_driver.hpp"

namespace tessera {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

int64_t& configured_count() {
  static int64_t n = CudaGpu::count();  // one device per physical GPU until gpu_devices(n) asks for more
  return n;
}

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

}  // namespace

int64_t virtual_gpu_count() {
  std::lock_guard lock(registry_mutex());
  return configured_count();
}

void ensure_virtual_gpus(int64_t n) {
  if (CudaGpu::count() == 0)
    throw DeviceError(fmt::format("gpu_devices({}): this process has no GPU ({})", n, CudaDriver::why_unavailable().empty()
                                                                                         ? "the driver reports none"
                                                                                         : CudaDriver::why_unavailable()));
  std::lock_guard lock(registry_mutex());
  configured_count() = std::max(configured_count(), n);
}

VirtualGpu& VirtualGpu::get(int64_t index) {
  static auto* devices = new std::map<int64_t, std::unique_ptr<VirtualGpu>>();  // lives until exit
  std::lock_guard lock(registry_mutex());
  if (index < 0 || index >= configured_count())
    throw DeviceError(fmt::format("no device GPU:{}: this process has {} GPU device(s)", index, configured_count()));
  auto& device = (*devices)[index];
  if (!device) device.reset(new VirtualGpu(index, CudaGpu::get(index % CudaGpu::count())));
  return *device;
}

VirtualGpu::VirtualGpu(int64_t index, CudaGpu& gpu) : index_(index), gpu_(gpu) {
  const CudaDriver& cu = cuda_driver();
  make_current();
  cu.check(cu.cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
}

cublasHandle_t VirtualGpu::cublas_handle() {
  std::call_once(cublas_once_, [&] {
    const CublasLibrary& blas = cublas();
    make_current();
    blas.check(blas.create(&cublas_), "cublasCreate");
    blas.check(blas.set_stream(cublas_, reinterpret_cast<cudaStream_t>(stream_)), "cublasSetStream");
    // f32 GEMMs in f32: no TF32 unless a dtype or setting asks (CUBLAS_DEFAULT_MATH allows none).
    blas.check(blas.set_math_mode(cublas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    // A workspace of its own (after the stream: setting one resets it), so a GEMM recorded in a
    // CUDA graph (backend/cuda/cuda_graph_runs.hpp) allocates nothing; 32 MiB is cuBLAS's
    // recommendation for Hopper. Kept for the life of the process, as the handle is.
    const CudaDriver& cu = cuda_driver();
    CUdeviceptr workspace = 0;
    cu.check(cu.cuMemAllocAsync(&workspace, kCublasWorkspaceBytes, stream_), "cuMemAllocAsync (cuBLAS workspace)");
    synchronize();
    blas.check(blas.set_workspace(cublas_, reinterpret_cast<void*>(uintptr_t(workspace)), kCublasWorkspaceBytes),
               "cublasSetWorkspace");
  });
  return cublas_;
}

void VirtualGpu::synchronize() const {
  const CudaDriver& cu = cuda_driver();
  make_current();
  cu.check(cu.cuStreamSynchronize(stream_), "cuStreamSynchronize");
}

}  // namespace tessera
