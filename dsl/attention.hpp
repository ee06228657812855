// Scaled dot-product attention (PyTorch's F.scaled_dot_product_attention, without dropout):
// softmax(q k^T * scale + causal mask) v over the last two axes, batched over the leading ones.
// Heads sharded over a mesh dim (a leading axis) run with no communication: every op is
// batched over them. Built from primitive ops; it materialises the [Lq, Lk] scores.
#pragma once

#include <optional>

#include "dsl/ops.hpp"

namespace tessera {

// q [..., Lq, E], k [..., Lk, E], v [..., Lk, Ev] -> [..., Lq, Ev]. causal: query i sees keys
// j <= i (PyTorch's top-left aligned mask). scale defaults to 1 / sqrt(E).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    std::optional<double> scale = std::nullopt, Loc where = Loc::current());

}  // namespace tessera
