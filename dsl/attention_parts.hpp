// The fused attention primitive (OpKind::Attention) and its three parts. One node computes one
// part on row-major q [..., lq, e], k [..., lk, e], v [..., lk, ev] (the leading axes alike):
//   Forward  (q, k, v)                  -> [..., lq, ev + 1]: softmax(q k^T * scale + mask) v, then
//                                          each query's logsumexp of its scores in the last column
//   GradQ    (q, k, v, forward, d_out)  -> dq [..., lq, e]
//   GradKV   (q, k, v, forward, d_out)  -> [..., lk, e + ev]: dk, then dv
// d_out is the adjoint of the whole forward output [..., lq, ev + 1], the logsumexp column's
// included: a user of the logsumexp (ring attention's merge of blocks) has its gradient too.
// A causal node may take one more input, last: an i64 scalar `shift` moving the mask, so key j
// is visible to query i when j <= i + shift (plus the global position of the query block where
// the partitioner shards the queries). Ring attention's blocks pass the difference of their
// queries' and keys' sequence positions there, a value known only on the device as it runs.
// With it a query may see no key: its output row is 0 and its logsumexp -inf.
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
// The operand count of `part` without the mask's shift input (3 for the forward, 5 for the
// gradients); a node with one more input has a shift.
size_t attention_operand_count(AttentionPart part);

}  // namespace tessera
