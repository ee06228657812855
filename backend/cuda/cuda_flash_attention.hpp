// The CUDA library kernels for the attention primitive's three parts: which instantiation of
// backend/cuda/flash_attention.cu (CUDA cores) or backend/cuda/flash_attention_mma.cu (tensor
// cores) a call takes (its tile, its columns per thread, its shared memory), the CUDA C that NVRTC compiles for it, and the launch on a GPU's stream. All but the
// launch is host logic that needs no GPU (test_cuda_attention checks it, and runs the kernels
// themselves on the CPU through test/cuda_emulation.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "dsl/attention_parts.hpp"
#include "dsl/dtype.hpp"

namespace tessera {

class VirtualGpu;
struct LibraryCall;

// The kernels' argument: flash_attention.cu's tsr_attention::Params, field for field.
struct FlashAttentionParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* forward = nullptr;
  const void* d_out = nullptr;
  void* out = nullptr;
  long long batch = 0, lq = 0, lk = 0, e = 0, ev = 0;
  long long q_offset = 0;
  double scale = 1.0;
  int causal = 0;
};

// The widest head the kernels take (q and k's e, v's ev): 16 columns per thread.
inline constexpr int64_t kFlashAttentionMaxHead = 256;
// 256 threads (a 16 x 16 grid) per block.
inline constexpr int kFlashAttentionThreads = 256;
// The tensor-core kernels: bf16 and f16 heads of up to 128 columns on compute capability 8.0 and
// later, four warps (128 threads) per block, tiles of 64 rows.
inline constexpr int64_t kFlashAttentionMmaMaxHead = 128;
inline constexpr int kFlashAttentionMmaThreads = 128;
inline constexpr int kFlashAttentionMmaTile = 64;

struct FlashAttentionKernel {
  AttentionPart part = AttentionPart::Forward;
  DType dtype = DType::f32;  // f32, f64, bf16 or f16
  int tile = 64;             // rows a block owns, and the other sequence's tile (64, 32 or 16)
  int e_columns = 1;         // head columns per thread: ceil(e / 16), and ceil(ev / 16); on tensor
  int ev_columns = 1;        // cores the heads' widths rounded up to 16 are 16 e_columns and 16 ev_columns
  bool tensor_cores = false;  // flash_attention_mma.cu's kernels (tile 64)

  std::string name() const;  // the entry point, e.g. tessera_flash_attention_forward_f32_t64_e8_v8
  int64_t shared_bytes() const;
  int threads() const;  // per block
  // Blocks of a launch: one per (leading index, tile of queries) or, for grad_kv, of keys.
  int64_t blocks(int64_t batch, int64_t lq, int64_t lk) const;
};

// The instantiation for one part on heads of e and ev columns for a GPU of `compute_capability`
// (90 for sm_90; 0 for one without tensor cores): the tensor-core kernels for bf16 and f16 heads
// of up to kFlashAttentionMmaMaxHead from 80 on, where their shared memory fits; else the CUDA
// cores' kernels with the largest tile whose shared memory fits `max_shared_bytes` (the GPU's
// opt-in limit per block). A head wider than kFlashAttentionMaxHead, an unsupported dtype or a
// limit no tile fits is a DeviceError.
FlashAttentionKernel flash_attention_kernel(AttentionPart part, DType dtype, int64_t e, int64_t ev, int64_t max_shared_bytes,
                                            int compute_capability = 0);

// The CUDA C for NVRTC: the kernel prelude, flash_attention.cu and one extern "C" entry.
std::string flash_attention_source(const FlashAttentionKernel& kernel);

// The part `call` names, on the device's stream: out = the part of q, k, v (and the forward's
// output and its adjoint), compiled on first use per instantiation and GPU architecture.
// TESSERA_ATTENTION_TENSOR_CORES=0 keeps bf16 and f16 on the CUDA cores' kernels (to compare them).
void flash_attention_on_gpu(VirtualGpu& gpu, const LibraryCall& call);

}  // namespace tessera
