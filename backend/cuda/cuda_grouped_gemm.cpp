#include "backend/cuda/cuda_grouped_gemm.hpp"

#include <fmt/format.h>

#include <map>
#include <mutex>

#include "backend/cuda/cuda_driver.hpp"
#include "backend/cuda/cuda_gpu.hpp"
#include "backend/cuda/grouped_gemm_mma_source.hpp"
#include "backend/cuda/grouped_gemm_source.hpp"
#include "backend/cuda/library_kernel_source.hpp"
#include "backend/cuda/nvrtc_compiler.hpp"
#include "backend/cuda/virtual_gpu.hpp"
#include "backend/cuda/warp_fragments_source.hpp"
#include "backend/cuda/warp_mma_source.hpp"
#include "dsl/error.hpp"
#include "jit/library_call.hpp"

namespace tessera {
namespace {

constexpr int64_t kTile = 64, kDepth = 16;  // grouped_gemm.cu's kTile and kDepth
constexpr int64_t kMmaDepth = 32;           // grouped_gemm_mma.cu's

const char* grouped_element_type(DType dtype) { return storage_type_name(dtype, "grouped GEMM"); }

const char* function_of(LibraryOp op) {
  if (op == LibraryOp::GroupedGemm) return "grouped_gemm";
  if (op == LibraryOp::GroupedWeightGradGemm) return "grouped_weight_grad";
  throw InternalError(fmt::format("grouped GEMM on a GPU: {} is not a grouped GEMM", library_op_name(op)));
}

// How many tiles of `b` cover `a`.
int64_t tiles_of(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string GroupedGemmKernel::name() const {
  (void)grouped_element_type(dtype);
  return fmt::format("tessera_{}{}_{}", function_of(op), tensor_cores ? "_mma" : "", dtype_name(dtype));
}

int GroupedGemmKernel::threads() const { return tensor_cores ? kGroupedGemmMmaThreads : kGroupedGemmThreads; }

int64_t GroupedGemmKernel::shared_bytes() const {
  // grouped_gemm_mma.cu's: 16-bit tiles of x [64][32 + 8] (transposed for the weight gradient)
  // and of w or dy [32][64 + 8].
  if (tensor_cores) return (kTile * (kMmaDepth + 8) + kMmaDepth * (kTile + 8)) * 2;
  return (kTile * (kDepth + 1) + kDepth * (kTile + 1)) * (dtype == DType::f64 ? 8 : 4);
}

int64_t GroupedGemmKernel::blocks(const GroupedGemmParams& p) const {
  if (op == LibraryOp::GroupedGemm) return p.n == 0 || p.f == 0 ? 0 : tiles_of(p.n, kTile) * tiles_of(p.f, kTile);
  return p.k == 0 || p.f == 0 ? 0 : p.experts * tiles_of(p.k, kTile) * tiles_of(p.f, kTile);
}

GroupedGemmKernel grouped_gemm_kernel(LibraryOp op, DType dtype, int compute_capability, bool ordered) {
  (void)function_of(op);
  (void)grouped_element_type(dtype);
  const bool tensor_cores = is_16_bit_float(dtype) && compute_capability >= 80 && !ordered;
  return {op, dtype, tensor_cores};
}

std::string grouped_gemm_source(const GroupedGemmKernel& k) {
  std::string source = library_kernel_preamble();
  source += kGroupedGemmCudaSource;
  if (k.tensor_cores) {
    source += kWarpMmaCudaSource;
    source += kWarpFragmentsCudaSource;
    source += kGroupedGemmMmaCudaSource;
  }
  source += fmt::format("\nextern \"C\" __global__ void __launch_bounds__({}) {}(tsr_grouped::Params p) {{\n"
                        "  tsr_grouped::{}{}<{}>(p);\n}}\n",
                        k.threads(), k.name(), function_of(k.op), k.tensor_cores ? "_mma" : "", grouped_element_type(k.dtype));
  return source;
}

void grouped_gemm_on_gpu(VirtualGpu& gpu, const LibraryCall& call) {
  const Array &x = *call.inputs.at(0), &other = *call.inputs.at(1), &ends = *call.inputs.at(2);
  Array& out = *call.out;
  if (ends.dtype() != DType::i64) throw InternalError("grouped GEMM on a GPU: the group ends are not int64");
  GroupedGemmParams p;
  p.n = x.shape().at(0);
  p.k = x.shape().at(1);
  p.f = other.shape().back();
  p.experts = ends.numel();
  p.row_offset = call.row_offset;
  CudaGpu& device = gpu.gpu();
  const GroupedGemmKernel kernel = grouped_gemm_kernel(call.op, x.dtype(), device.compute_capability(), call.ordered);
  const int64_t blocks = kernel.blocks(p);
  if (blocks == 0) return;  // an empty output
  p.x = x.device_bytes();
  p.other = other.device_bytes();
  p.ends = reinterpret_cast<const long long*>(ends.device_bytes());
  p.out = out.device_bytes();
  // Compiled once per kernel and architecture in a process; loaded once per GPU.
  static std::mutex mutex;
  static std::map<std::string, std::string> images;
  CUfunction function = nullptr;
  {
    std::lock_guard lock(mutex);
    const std::string key = fmt::format("{}_sm{}", kernel.name(), device.compute_capability());
    std::string& image = images[key];
    if (image.empty())
      image = NvrtcCompiler(device.compute_capability(), /*deterministic=*/false)
                  .compile_source(grouped_gemm_source(kernel), kernel.name() + ".cu")
                  .binary;
    function = device.load(key, image, {kernel.name()}, {CudaKernel{}}).at(0)->function;
  }
  const CudaDriver& cu = cuda_driver();
  void* arguments[] = {&p};
  gpu.make_current();
  cu.check(cu.cuLaunchKernel(function, unsigned(blocks), 1, 1, unsigned(kernel.threads()), 1, 1, unsigned(kernel.shared_bytes()),
                             gpu.stream(), arguments, nullptr),
           "cuLaunchKernel (grouped GEMM)");
}

}  // namespace tessera
