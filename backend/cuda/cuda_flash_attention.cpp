#include "backend/cuda/cuda_flash_attention.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string_view>

#include "backend/cuda/cuda_driver.hpp"
#include "backend/cuda/cuda_gpu.hpp"
#include "backend/cuda/flash_attention_mma_source.hpp"
#include "backend/cuda/flash_attention_source.hpp"
#include "backend/cuda/library_kernel_source.hpp"
#include "backend/cuda/nvrtc_compiler.hpp"
#include "backend/cuda/virtual_gpu.hpp"
#include "backend/cuda/warp_fragments_source.hpp"
#include "backend/cuda/warp_mma_source.hpp"
#include "dsl/error.hpp"
#include "jit/library_call.hpp"

namespace tessera {
namespace {

const char* part_text(AttentionPart part) {
  switch (part) {
    case AttentionPart::Forward: return "forward";
    case AttentionPart::GradQ: return "grad_q";
    case AttentionPart::GradKV: return "grad_kv";
  }
  throw InternalError("flash attention: unknown part");
}

// The kernel's element type, as storage_types.cu names it.
const char* element_type(DType dtype) { return storage_type_name(dtype, "flash attention"); }
const char* short_name(DType dtype) {
  (void)element_type(dtype);
  return dtype == DType::f32 ? "f32" : dtype == DType::f64 ? "f64" : dtype == DType::bf16 ? "bf16" : "f16";
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string FlashAttentionKernel::name() const {
  return fmt::format("tessera_flash_attention_{}{}_{}_t{}_e{}_v{}", tensor_cores ? "mma_" : "", part_text(part), short_name(dtype), tile,
                     e_columns, ev_columns);
}

int FlashAttentionKernel::threads() const { return tensor_cores ? kFlashAttentionMmaThreads : kFlashAttentionThreads; }

// The shared-memory layout of each part (flash_attention.cu's comments): head-wide tiles of rows
// 16 C + 1 apart, [tile, tile] score tiles, and two per-query rows for the gradients.
int64_t FlashAttentionKernel::shared_bytes() const {
  if (tensor_cores) {
    // flash_attention_mma.cu's: 16-bit tiles of rows 16 C + 8 apart, f32 logsumexp and delta rows.
    const int64_t le = 16 * int64_t(e_columns) + 8, lv = 16 * int64_t(ev_columns) + 8, t = kFlashAttentionMmaTile;
    return part == AttentionPart::Forward ? (2 * t * le + t * lv) * 2 : (2 * t * le + 2 * t * lv) * 2 + 2 * t * 4;
  }
  const int64_t se = 16 * int64_t(e_columns) + 1, sv = 16 * int64_t(ev_columns) + 1, t = tile;
  const int64_t sum_bytes = dtype == DType::f64 ? 8 : 4;
  int64_t elements = 0;
  switch (part) {
    case AttentionPart::Forward: elements = 2 * t * se + t * sv + t * t; break;
    case AttentionPart::GradQ: elements = 2 * t * se + 2 * t * sv + t * t + 2 * t; break;
    case AttentionPart::GradKV: elements = 2 * t * se + 2 * t * sv + 2 * t * t + 2 * t; break;
  }
  return elements * sum_bytes;
}

int64_t FlashAttentionKernel::blocks(int64_t batch, int64_t lq, int64_t lk) const {
  return batch * ceil_div(part == AttentionPart::GradKV ? lk : lq, tile);
}

FlashAttentionKernel flash_attention_kernel(AttentionPart part, DType dtype, int64_t e, int64_t ev, int64_t max_shared_bytes,
                                            int compute_capability) {
  (void)element_type(dtype);
  if (e < 1 || ev < 1 || e > kFlashAttentionMaxHead || ev > kFlashAttentionMaxHead)
    throw DeviceError(fmt::format("flash attention on a GPU: heads of {} (q, k) and {} (v) columns; the kernel takes 1 to {}", e, ev,
                                  kFlashAttentionMaxHead));
  FlashAttentionKernel k;
  k.part = part;
  k.dtype = dtype;
  k.e_columns = int(ceil_div(e, 16));
  k.ev_columns = int(ceil_div(ev, 16));
  if (compute_capability >= 80 && is_16_bit_float(dtype) && e <= kFlashAttentionMmaMaxHead &&
      ev <= kFlashAttentionMmaMaxHead) {
    k.tensor_cores = true;
    k.tile = kFlashAttentionMmaTile;
    if (k.shared_bytes() <= max_shared_bytes) return k;
    k.tensor_cores = false;
  }
  for (int tile : {64, 32, 16}) {
    k.tile = tile;
    if (k.shared_bytes() <= max_shared_bytes) return k;
  }
  throw DeviceError(fmt::format("flash attention on a GPU: {} on heads of {} and {} columns needs {} bytes of shared memory per block; "
                                "this GPU gives {}",
                                part_text(part), e, ev, k.shared_bytes(), max_shared_bytes));
}

std::string flash_attention_source(const FlashAttentionKernel& k) {
  std::string source = library_kernel_preamble();
  source += kFlashAttentionCudaSource;
  if (k.tensor_cores) {
    source += kWarpMmaCudaSource;
    source += kWarpFragmentsCudaSource;
    source += kFlashAttentionMmaCudaSource;
    source += fmt::format("\nextern \"C\" __global__ void __launch_bounds__({}) {}(tsr_attention::Params p) {{\n"
                          "  tsr_attention::{}_mma<{}, {}, {}>(p);\n}}\n",
                          kFlashAttentionMmaThreads, k.name(), part_text(k.part), element_type(k.dtype), 16 * k.e_columns,
                          16 * k.ev_columns);
    return source;
  }
  source += fmt::format("\nextern \"C\" __global__ void __launch_bounds__({}) {}(tsr_attention::Params p) {{\n"
                        "  tsr_attention::{}<{}, {}, {}, {}>(p);\n}}\n",
                        kFlashAttentionThreads, k.name(), part_text(k.part), element_type(k.dtype), k.tile, k.e_columns,
                        k.ev_columns);
  return source;
}

void flash_attention_on_gpu(VirtualGpu& gpu, const LibraryCall& call) {
  const Array &q = *call.inputs.at(0), &kk = *call.inputs.at(1), &v = *call.inputs.at(2);
  Array& out = *call.out;
  const size_t r = q.shape().size();
  FlashAttentionParams p;
  p.batch = 1;
  for (size_t a = 0; a + 2 < r; ++a) p.batch *= q.shape()[a];
  p.lq = q.shape()[r - 2];
  p.e = q.shape()[r - 1];
  p.lk = kk.shape()[r - 2];
  p.ev = v.shape()[r - 1];
  p.q_offset = call.q_offset;
  p.scale = call.attention.scale;
  p.causal = call.attention.causal ? 1 : 0;
  CudaGpu& device = gpu.gpu();
  const CudaDriver& cu = cuda_driver();
  // No rows on this device (a sharded axis's empty block): zeros, as the CPU's kernel gives.
  if (p.batch == 0 || p.lq == 0 || p.lk == 0) {
    if (out.numel() > 0) {
      gpu.make_current();
      cu.check(cu.cuMemsetD8Async(device_pointer(out.device_bytes()), 0, size_t(out.numel() * dtype_size(out.dtype())), gpu.stream()),
               "cuMemsetD8Async (flash attention)");
    }
    return;
  }
  const char* tensor_cores = std::getenv("TESSERA_ATTENTION_TENSOR_CORES");
  const bool no_tensor_cores = tensor_cores != nullptr && std::string_view(tensor_cores) == "0";
  const FlashAttentionKernel kernel = flash_attention_kernel(call.attention.part, q.dtype(), p.e, p.ev, device.max_shared_bytes_per_block(),
                                                             no_tensor_cores ? 0 : device.compute_capability());
  p.q = q.device_bytes();
  p.k = kk.device_bytes();
  p.v = v.device_bytes();
  if (call.attention.part != AttentionPart::Forward) {
    p.forward = call.inputs.at(3)->device_bytes();
    p.d_out = call.inputs.at(4)->device_bytes();
  }
  p.out = out.device_bytes();

  // Compiled once per instantiation and architecture in a process; loaded once per GPU.
  static std::mutex mutex;
  static std::map<std::string, std::string> images;
  static std::set<CUfunction> sized;
  CUfunction function = nullptr;
  const int64_t shared = kernel.shared_bytes();
  {
    std::lock_guard lock(mutex);
    const std::string key = fmt::format("{}_sm{}", kernel.name(), device.compute_capability());
    std::string& image = images[key];
    if (image.empty())
      image = NvrtcCompiler(device.compute_capability(), /*deterministic=*/false)
                  .compile_source(flash_attention_source(kernel), kernel.name() + ".cu")
                  .binary;
    function = device.load(key, image, {kernel.name()}, {CudaKernel{}}).at(0)->function;
    if (sized.insert(function).second) {
      gpu.make_current();
      cu.check(cu.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared)),
               "cuFuncSetAttribute (flash attention's shared memory)");
    }
  }
  void* arguments[] = {&p};
  gpu.make_current();
  cu.check(cu.cuLaunchKernel(function, unsigned(kernel.blocks(p.batch, p.lq, p.lk)), 1, 1, unsigned(kernel.threads()), 1, 1,
                             unsigned(shared), gpu.stream(), arguments, nullptr),
           "cuLaunchKernel (flash attention)");
}

}  // namespace tessera
