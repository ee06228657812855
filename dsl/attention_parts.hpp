// The fused attention primitive (OpKind::Attention) and its three parts. One node computes one
// part on row-major q [..., lq, e], k [..., lk, e], v [..., lk, ev] (the leading axes alike):
//   Forward  (q, k, v)                  -> [..., lq, ev + 1]: softmax(q k^T * scale + mask) v, then
//                                          each query's logsumexp of its scores in the last column
//   GradQ    (q, k, v, forward, d_out)  -> dq [..., lq, e]
//   GradKV   (q, k, v, forward, d_out)  -> [..., lk, e + ev]: dk, then dv
// The scores are never materialised (backend/cpu/cpu_attention.hpp computes them in tiles). The
// attributes: axes = {part, causal}, scalar = scale.
#pragma once

#include <string_view>

#include "dsl/node.hpp"

namespace tessera {

enum class AttentionPart : int64_t { Forward = 0, GradQ = 1, GradKV = 2 };

struct AttentionAttrs {
  AttentionPart part = AttentionPart::Forward;
  bool causal = false;
  double scale = 1.0;
};

NodeAttrs attention_node_attrs(const AttentionAttrs& a);
AttentionAttrs attention_attrs(const NodeAttrs& attrs);
std::string_view attention_part_name(AttentionPart part);

}  // namespace tessera
