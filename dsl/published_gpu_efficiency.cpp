#include "dsl/published_gpu_efficiency.hpp"

namespace tessera {

// Source: OpenXLA's GEMM cost model table for sm_90, xla/service/gpu/model/
// matmul_interpolator_data.h (tensorflow/tensorflow commit 372d578bb861cc5804e56d37d93aec931a59762c):
// measured H100 throughput of 375 GEMM shapes per dtype (batch 1, 2 or 4; m, n and k from 256 to
// 4096). Each point here is the median throughput of the shapes whose intensity m n k / (m n +
// n k + m k) rounds to it on a half-octave grid, over the datasheet's dense peak (989.4 TFLOP/s
// bf16, 494.7 TF32). The median, not the best: shapes of one intensity differ by their tiling
// and their waves over the 132 SMs, and a model's GEMMs are not chosen to fit them. A 4096^3
// bf16 GEMM (intensity 1365) runs at 80% of the peak; square 512s (171) at about 20%.
const std::vector<std::pair<double, double>>& hopper_bf16_gemm_efficiency() {
  static const std::vector<std::pair<double, double>> curve = {
      {90.5, 0.022}, {128, 0.079}, {181, 0.215}, {256, 0.349}, {362, 0.539},
      {512, 0.671},  {724, 0.746}, {1024, 0.773}, {1448, 0.802}};
  return curve;
}

const std::vector<std::pair<double, double>>& hopper_tf32_gemm_efficiency() {
  static const std::vector<std::pair<double, double>> curve = {
      {90.5, 0.032}, {128, 0.100}, {181, 0.192}, {256, 0.316}, {362, 0.424},
      {512, 0.577},  {724, 0.631}, {1024, 0.659}, {1448, 0.701}};
  return curve;
}

// Source: NCCL's maintainer in NVIDIA/nccl-tests issue 212 (2024-05-06): H100's NVLink line
// rate is 450 GB/s each way; "with the protocol overhead (~20%) NCCL can get an effective NVLink
// bandwidth of 370GB/s", the bus bandwidth of every collective run over rings. (All-reduce with
// NVLink SHARP reaches about 480 GB/s of bus bandwidth on 8 GPUs; the model charges every
// collective the ring's figure, which is what reduce-scatter, all-gather and all-to-all get.)
double nvlink_nccl_efficiency() { return 370.0 / 450.0; }

// Source: this project's own measurement (docs/GPU.md, 2026-11-30, `attention_bench --device
// gpu`): forward and gradients at T = 8192, 2 x 8 heads of 128, causal, took 127-141 ms on an
// H200, about 6.5 TFLOP/s, against the 67 TFLOP/s of its f32 vector units. The kernel sums in
// f32 on the CUDA cores (f32 and f64 data since 2026-12-01; bf16 and f16 before); PyTorch's
// FlashAttention-2 ran the same attention at 254 TFLOP/s on the tensor cores.
double cuda_attention_vector_efficiency() { return 6.5 / 67.0; }

// Source: this project's own measurement (docs/GPU.md, 2026-12-01, the same command in bf16):
// the tensor-core kernels (backend/cuda/flash_attention_mma.cu) took 50.1-52.3 ms on an H200,
// 18.4-19.2 TFLOP/s, against the 989.4 TFLOP/s of its bf16 tensor cores.
double cuda_tensor_core_attention_efficiency() { return 19.2 / 989.4; }

}  // namespace tessera
