// Context parallelism by ring attention (Liu et al., "Ring Attention with Blockwise Transformers";
// torch.distributed.tensor.experimental.context_parallel's ring; torchtitan's cp): attention over a
// sequence sharded over a mesh dim, where no device ever holds the whole sequence's keys.
//
// Each device keeps its block of queries and passes its block of keys and values around the
// ring with `shift` (mesh-dim size - 1 steps); at each step the fused attention kernel computes
// the queries against the block it holds, with each query's logsumexp, and the blocks' outputs
// are merged by their logsumexps (the online softmax across blocks). Gradients flow through the
// same graph: the backward passes the keys' and values' adjoints back around the ring.
//
// Causal attention is load-balanced as torchtitan's head-tail (zigzag): the sequence is cut into
// 2n chunks and device i computes with chunks 2i and 2n-1-2i of the queries, keys and values (it
// swaps the second half of its blocks with device n-1-i, by `permute`, and swaps the output
// back), so every device does the same share of the masked work at every step of the ring. The
// causal mask of each pair of chunks is shifted by their distance, known on the device as it
// runs, so one compiled program serves every device and step, and wholly masked pairs cost
// nothing. Inputs and output stay in natural order: nothing for the caller to reorder.
#pragma once

#include <optional>
#include <string>

#include "dsl/ops.hpp"

namespace tessera {

// scaled_dot_product_attention(q, k, v, causal, scale) computed by ring attention over mesh dim
// `mesh_dim`: q, k and v [..., L, E] (v [..., L, Ev]) with one sequence length L and the same
// leading axes. The result is laid out as q is, with the sequence sharded over mesh_dim: inputs
// are moved there first (a leading axis stays sharded over another mesh dim where it divides
// evenly, so heads over tp and batch over dp compose; anything else on another dim is
// replicated). L must divide by the mesh dim's size n (by 2n when causal, for head-tail
// balancing): a ShapeError otherwise. f32 and f64 run as they are; bf16 and f16 are widened to
// f32 and the result rounded once, as scaled_dot_product_attention does.
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, std::string mesh_dim,
                      std::optional<double> scale = std::nullopt, Loc where = Loc::current());

}  // namespace tessera
