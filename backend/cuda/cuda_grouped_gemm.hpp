// The CUDA library kernels for the grouped GEMMs (dsl/grouped_matmul.hpp's primitives, the
// experts' GEMMs of a mixture of experts): which kernel of backend/cuda/grouped_gemm.cu (CUDA
// cores) or backend/cuda/grouped_gemm_mma.cu (tensor cores) a call takes, its grid and shared memory, the CUDA C NVRTC compiles for it, and the launch on a GPU's
// stream. All but the launch is host logic that needs no GPU (test_cuda_grouped_gemm checks it,
// and runs the kernels themselves on the CPU through test/cuda_emulation.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "dsl/dtype.hpp"
#include "ir/library_op.hpp"

namespace tessera {

class VirtualGpu;
struct LibraryCall;

// The kernels' argument: grouped_gemm.cu's tsr_grouped::Params, field for field.
struct GroupedGemmParams {
  const void* x = nullptr;
  const void* other = nullptr;
  const long long* ends = nullptr;
  void* out = nullptr;
  long long n = 0, k = 0, f = 0, experts = 0;
  long long row_offset = 0;
};

inline constexpr int kGroupedGemmThreads = 256;
inline constexpr int kGroupedGemmMmaThreads = 128;  // grouped_gemm_mma.cu's four warps

struct GroupedGemmKernel {
  LibraryOp op = LibraryOp::GroupedGemm;  // or GroupedWeightGradGemm
  DType dtype = DType::f32;               // f32, f64, bf16 or f16
  bool tensor_cores = false;              // grouped_gemm_mma.cu's kernel

  std::string name() const;  // the entry point, e.g. tessera_grouped_gemm_f32
  int64_t shared_bytes() const;
  int threads() const;  // per block
  // Blocks of a launch: one per 64 x 64 tile of the output (for the weight gradient, of each
  // group's [k, f] matrix); 0 when the output is empty.
  int64_t blocks(const GroupedGemmParams& p) const;
};

// The kernel for `op` on `dtype` on a GPU of `compute_capability` (90 for sm_90; 0 for one
// without tensor cores): the experts' GEMM and its weight gradient of bf16 or f16 on tensor cores
// from 80 on unless `ordered` (deterministic mode keeps the CUDA cores' fixed order), else
// grouped_gemm.cu's kernels. DeviceError for another dtype.
GroupedGemmKernel grouped_gemm_kernel(LibraryOp op, DType dtype, int compute_capability = 0, bool ordered = false);

// The CUDA C for NVRTC: the kernel prelude, grouped_gemm.cu and one extern "C" entry.
std::string grouped_gemm_source(const GroupedGemmKernel& kernel);

// The call's grouped GEMM on the device's stream (x, w or dy, ends as in LibraryCall), compiled
// on first use per kernel and GPU architecture.
void grouped_gemm_on_gpu(VirtualGpu& gpu, const LibraryCall& call);

}  // namespace tessera
