// Fused (flash) attention on host memory: softmax(q k^T * scale + causal mask) v and its
// gradients, in tiles, so the [lq, lk] scores never exist in memory (Dao et al., FlashAttention-2;
// PyTorch's CPU flash kernel has the same shape). The three parts are the primitive op's
// (dsl/attention_parts.hpp):
//   forward   q, k, v                      -> [batch, lq, ev + 1]: the output, then the logsumexp
//                                             of each query's scores in the last column
//   grad_q    q, k, v, forward, d_out      -> dq [batch, lq, e]
//   grad_kv   q, k, v, forward, d_out      -> [batch, lk, e + ev]: dk, then dv
// d_out [batch, lq, ev + 1] is the adjoint of the forward's rows, the logsumexp's included.
// Blocks are row-major; `batch` runs over every leading axis. Each output element is summed in one
// fixed order whatever the tiling, the device's share of rows or the thread count, so the bits
// are the same on every mesh (TESSERA_DETERMINISTIC holds without a separate path).
#pragma once

#include <cstdint>

#include "backend/cpu/short_gemm.hpp"

namespace tessera {

struct AttentionExtents {
  int64_t batch = 1, lq = 0, lk = 0, e = 0, ev = 0;
  // Where the block's first query stands among the keys (its global position, moved by a mask
  // shift): causal masks use it. Any value: a query before key 0 sees none (output 0, lse -inf).
  int64_t q_offset = 0;
  bool causal = false;   // query i sees keys j <= i (PyTorch's top-left alignment)
  double scale = 1.0;
};

template <class T>
void attention_forward(const AttentionExtents& x, const T* q, const T* k, const T* v, T* out, int parts = 1,
                       const PartRunner& run = {});
template <class T>
void attention_grad_q(const AttentionExtents& x, const T* q, const T* k, const T* v, const T* forward, const T* d_out,
                      T* dq, int parts = 1, const PartRunner& run = {});
template <class T>
void attention_grad_kv(const AttentionExtents& x, const T* q, const T* k, const T* v, const T* forward, const T* d_out,
                       T* dkv, int parts = 1, const PartRunner& run = {});

}  // namespace tessera
