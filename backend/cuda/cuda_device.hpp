// A GPU device of a mesh: its arrays live in the GPU's memory (the driver's stream-ordered pool),
// kernels are NVRTC-compiled from kernel IR (codegen/cuda_renderer) and launched on the device's
// stream. Its library kernels (registered by backend/cuda/cuda_backend.cpp): GEMMs by cuBLAS, fused
// attention (backend/cuda/cuda_flash_attention) and the grouped GEMMs of mixtures of experts
// (backend/cuda/cuda_grouped_gemm). Calls only queue work; synchronize() waits, and host reads of its
// arrays wait for the work before them (Array's host mirror). A device is made per executable,
// so it keeps that program's runs recorded as CUDA graphs (backend/cuda/cuda_graph_runs.hpp).
#pragma once

#include "backend/cuda/cuda_graph_runs.hpp"
#include "ir/target.hpp"
#include "jit/device.hpp"
#include "jit/library_call.hpp"

namespace tessera {

class VirtualGpu;

class CudaDevice final : public Device {
 public:
  // `name` is "GPU:<index>" (gpu_devices()); `target` the program's (ir/target.hpp).
  CudaDevice(std::string name, int64_t index, const Target& target);

  const std::string& name() const override { return name_; }
  MemorySpace memory_space() const override { return MemorySpace::Cuda; }
  std::shared_ptr<std::byte[]> allocate(int64_t bytes) override;
  void copy_from_host(const std::byte* host, std::byte* device, int64_t bytes) override;
  void copy_to_host(const std::byte* device, std::byte* host, int64_t bytes) override;
  void copy_region(const Array& src, const std::vector<int64_t>& src_offset, Array& dst,
                   const std::vector<int64_t>& dst_offset, const std::vector<int64_t>& region_offset,
                   const std::vector<int64_t>& region_shape) override;
  void fill(std::byte* device, int64_t count, DType dtype, double value) override;
  void copy_bytes(const std::byte* from, std::byte* to, int64_t bytes) override;
  Array view(std::shared_ptr<std::byte[]> owner, std::byte* data, std::vector<int64_t> shape, DType dtype) override;
  Array to_device(const Array& array) override;
  Array copy(const Array& array) override;
  std::vector<const void*> load_kernels(const std::vector<kir::Kernel>& kernels) override;
  std::string kernel_home() const override;
  void launch(const KernelLaunch& launch) override;
  void synchronize() override;
  bool records_runs() const override;
  void run_steps(const std::vector<const void*>& buffers, const std::function<void()>& steps) override;

  // Library kernel: a GEMM by cuBLAS, or `ordered` (each sum in source order) by
  // backend/cuda/cuda_ordered_gemm.
  void gemm(const LibraryCall& call, bool ordered);
  // Library kernel: an attention part by backend/cuda/cuda_flash_attention.
  void attention(const LibraryCall& call);
  // Library kernel: a grouped GEMM by backend/cuda/cuda_grouped_gemm.
  void grouped_gemm(const LibraryCall& call);

 private:
  std::string name_;
  VirtualGpu& gpu_;
  bool deterministic_;                 // kernels compiled without contraction
  std::vector<int64_t> launch_words_;  // a launch's by-value argument, reused
  CudaGraphRuns graph_runs_;           // this executable's runs on this device, recorded
};

}  // namespace tessera
