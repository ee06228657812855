// Rotary position embeddings (RoPE, Su et al.) as Llama uses them: each head's dims are rotated in
// pairs by angles position * inverse_frequency, with Llama 3's low-frequency scaling where the
// config asks for it. The tables are computed on the devices from iota (no host constant enters
// the program), elementwise on replicated values: the same bits on every mesh.
#pragma once

#include <cstdint>
#include <vector>

#include "dsl/mesh.hpp"
#include "dsl/tensor.hpp"
#include "nn/transformer_config.hpp"

namespace tessera {

// cos and sin of the rotation angles, [seq, head_dim / 2] (f32), replicated on `mesh`.
struct RotaryTables {
  Tensor cos, sin;
};

// The head_dim / 2 inverse frequencies theta^(-2i / head_dim), scaled as Llama 3's
// apply_scaling does when config.rope_scaling is set: wavelengths shorter than
// original_max_position / high_freq_factor kept, longer than original_max_position /
// low_freq_factor divided by factor, a smooth blend between. In double, on the host: what the
// device tables are checked against.
std::vector<double> rotary_inverse_frequencies(const TransformerConfig& config);

// The tables for positions 0 .. seq - 1. ShapeError for an odd head_dim or seq < 1.
RotaryTables rotary_tables(const TransformerConfig& config, int64_t seq, const Mesh& mesh);

// x [..., batch, seq, heads, head_dim] rotated (leading axes: a pipeline's stages): the first and second halves of each head form the
// pairs (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos), Hugging Face's rotate_half convention
// (Meta's interleaved pairs are a fixed permutation of wq's and wk's columns). x may be sharded
// over heads (tensor parallel) or over seq (sequence and context parallel): the tables follow.
Tensor apply_rotary(const Tensor& x, const RotaryTables& tables);

}  // namespace tessera
