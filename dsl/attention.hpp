// Scaled dot-product attention (PyTorch's F.scaled_dot_product_attention, without dropout):
// softmax(q k^T * scale + causal mask) v over the last two axes, batched over the leading ones.
// Heads sharded over a mesh dim (a leading axis) run with no communication, and so do queries
// sharded over their sequence (context parallelism: only k and v are gathered).
//
// Two implementations, as PyTorch's SDPBackend: Flash, one fused primitive per pass (forward,
// dq, dk and dv: dsl/attention_parts.hpp), taken for f32, f64, bf16 and f16 operands of one
// shape from 256 keys on (16-bit operands read as they are, results f32 and rounded once to
// their dtype: FlashAttention-2's contract, tensor cores on GPUs); and Math, primitive ops
// (matmul, mask, softmax, matmul), which materialise the [lq, lk] scores, for everything else
// (shorter sequences, where its GEMMs are as fast; other dtypes, broadcast leading axes,
// local_map values). SdpaKernel({SdpBackend::Flash}) takes the fused primitive at any length.
// The choice never depends on the mesh's devices: where their backend has a fused kernel (CPUs,
// GPUs) the scores are never materialised; where it has none the driver computes each part from
// ordinary ops before partitioning (jit/library_fallback.hpp).
#pragma once

#include <array>
#include <optional>
#include <vector>

#include "dsl/attention_parts.hpp"
#include "dsl/ops.hpp"

namespace tessera {

// q [..., Lq, E], k [..., Lk, E], v [..., Lk, Ev] -> [..., Lq, Ev]. causal: query i sees keys
// j <= i (PyTorch's top-left aligned mask). scale defaults to 1 / sqrt(E).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    std::optional<double> scale = std::nullopt, Loc where = Loc::current());

// torch.nn.attention.SDPBackend: the implementations scaled_dot_product_attention may pick.
enum class SdpBackend { Math, Flash };

// torch.nn.attention.sdpa_kernel: while in scope, scaled_dot_product_attention on this thread
// picks among `backends` only (Flash first where it applies and the sequence is long enough).
// With Flash alone, a call it does not apply to throws an Error saying why.
class SdpaKernel {
 public:
  explicit SdpaKernel(std::vector<SdpBackend> backends);
  ~SdpaKernel();
  SdpaKernel(const SdpaKernel&) = delete;
  SdpaKernel& operator=(const SdpaKernel&) = delete;

 private:
  std::vector<SdpBackend> previous_;
};

namespace detail {
// The fused forward node itself: [..., lq, ev + 1], the output then each query's logsumexp, for
// f32, f64, bf16 or f16 q, k, v of one shape (local values too); f64's result is f64, the
// others' f32. `mask_shift` (causal only): an i64 scalar moving the mask
// (dsl/attention_parts.hpp). Ring attention merges such blocks.
Tensor attention_with_logsumexp(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                const std::optional<Tensor>& mask_shift, Loc where);
// dq and [dk, dv] (side by side on the last axis) of the fused attention given its forward
// output `forward` ([..., lq, ev + 1], the output then the logsumexp, from
// attention_with_logsumexp or merged from several blocks' as ring attention's) and that output's
// adjoint `d_forward` (same shape): the GradQ and GradKV parts.
std::array<Tensor, 2> attention_gradients(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& forward,
                                          const Tensor& d_forward, bool causal, double scale,
                                          const std::optional<Tensor>& mask_shift, Loc where);
// The attention part `attrs.part` of `inputs` (dsl/attention_parts.hpp) built from ordinary ops:
// the same values as the fused primitive, its scores materialised.
NodeRef attention_part_from_ops(const AttentionAttrs& attrs, const std::vector<NodeRef>& inputs, Loc where);
// Autodiff's rule for the fused forward node: dq, dk and dv given the adjoint of its whole output
// (logsumexp column included). The backward parts read `forward`'s output and logsumexp and the
// forward's operands `inputs` (q, k, v and the mask's shift if any): the forward node's own, or
// under activation checkpointing (dsl/checkpoint.hpp) the recomputed copies of them.
std::array<Tensor, 3> flash_attention_vjp(const NodeRef& forward, const std::vector<NodeRef>& inputs, const Tensor& d_forward,
                                          Loc where);
}  // namespace detail

}  // namespace tessera
