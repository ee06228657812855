#include "backend/cuda/cuda_backend.hpp"

#include "backend/cuda/cuda_device.hpp"
#include "backend/cuda/cuda_gpu.hpp"
#include "backend/cuda/cuda_group_communicator.hpp"
#include "backend/cuda/nccl_communicator.hpp"
#include "backend/cuda/nccl_library.hpp"
#include "backend/cuda/virtual_gpu.hpp"
#include "comm/client_group.hpp"
#include "jit/backend_registry.hpp"

namespace tessera {

void register_cuda_backend() {
  Backend cuda;
  cuda.kind = DeviceKind::GPU;
  cuda.lowering_target = kir::LoopTarget::Cuda;
  // What NVRTC compiles for: the first GPU's architecture (a process's GPUs are of one kind).
  cuda.arch = [] { return "sm_" + std::to_string(VirtualGpu::get(0).gpu().compute_capability()); };
  cuda.library = {
      {LibraryOp::Gemm, [](Device& d, const LibraryCall& call) { device_as<CudaDevice>(d).gemm(call, false); }},
      {LibraryOp::OrderedGemm, [](Device& d, const LibraryCall& call) { device_as<CudaDevice>(d).gemm(call, true); }},
      // cuBLAS's bf16 tensor-core GEMM. No ordered one yet: deterministic bf16 Dots stay generated kernels.
      {LibraryOp::Bf16Gemm, [](Device& d, const LibraryCall& call) { device_as<CudaDevice>(d).gemm(call, false); }},
      // FlashAttention-2's tiling (backend/cuda/flash_attention.cu): the scores never stored.
      {LibraryOp::AttentionForward, [](Device& d, const LibraryCall& call) { device_as<CudaDevice>(d).attention(call); }},
      {LibraryOp::AttentionGradQ, [](Device& d, const LibraryCall& call) { device_as<CudaDevice>(d).attention(call); }},
      {LibraryOp::AttentionGradKV, [](Device& d, const LibraryCall& call) { device_as<CudaDevice>(d).attention(call); }},
      // The experts' GEMMs, their group bounds read on the device (backend/cuda/grouped_gemm.cu).
      {LibraryOp::GroupedGemm, [](Device& d, const LibraryCall& call) { device_as<CudaDevice>(d).grouped_gemm(call); }},
      {LibraryOp::GroupedWeightGradGemm, [](Device& d, const LibraryCall& call) { device_as<CudaDevice>(d).grouped_gemm(call); }},
  };
  cuda.make_device = [](const DeviceName& name, const DevicePlacement&, const Target& target) -> std::unique_ptr<Device> {
    return std::make_unique<CudaDevice>(name.to_string(), name.index, target);
  };
  cuda.device_count = [](int64_t wanted) {
    if (wanted > 0) ensure_virtual_gpus(wanted);
    return virtual_gpu_count();
  };
  cuda.device_group = create_cuda_group;
  // NCCL where every member of the group has it (TESSERA_NCCL_LIBRARY=none turns it off); else
  // the group moves device values through host memory, as without NCCL.
  cuda.client_device_group = [](ClientGroup& clients, int64_t device) -> std::shared_ptr<Communicator> {
    std::vector<int64_t> missing{NcclLibrary::get() ? 0 : 1};
    clients.all_reduce_sum(missing);
    if (missing[0] > 0) return nullptr;
    return create_nccl_communicator(clients, device);
  };
  register_backend(std::move(cuda));
}

}  // namespace tessera
