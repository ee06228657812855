#include "nn/transformer_config.hpp"

#include <cmath>
#include <string>

#include "dsl/error.hpp"

namespace tessera {
namespace {

void require_positive(int64_t value, const char* field) {
  if (value < 1) throw ShapeError("TransformerConfig: " + std::string(field) + " must be at least 1, got " + std::to_string(value));
}

// Linear layers' weights (and biases when the config has them).
int64_t linear(const TransformerConfig& c, int64_t in, int64_t out) { return in * out + (c.bias ? out : 0); }

int64_t norm(const TransformerConfig& c) { return c.norm == NormKind::LayerNorm ? 2 * c.dim : c.dim; }

int64_t attention(const TransformerConfig& c) {
  const int64_t kv = c.kv_heads * c.head_dim();
  return linear(c, c.dim, c.dim) + 2 * linear(c, c.dim, kv) + linear(c, c.dim, c.dim);
}

int64_t mlp(const TransformerConfig& c, int64_t hidden) {
  return c.mlp == MlpKind::SwiGLU ? 2 * linear(c, c.dim, hidden) + linear(c, hidden, c.dim)
                                  : linear(c, c.dim, hidden) + linear(c, hidden, c.dim);
}

// One MoE layer's parameters: the router, `routed` routed experts and the shared ones.
int64_t moe(const TransformerConfig& c, int64_t routed) {
  const MoEConfig& m = *c.moe;
  const int64_t expert = 3 * c.dim * m.expert_hidden;  // SwiGLU experts, no biases
  return c.dim * m.num_experts + (routed + m.num_shared_experts) * expert;
}

int64_t count(const TransformerConfig& c, bool active) {
  checked_transformer_config(c);
  int64_t total = c.vocab * c.dim;                                     // the embedding table
  if (c.positions == PositionKind::Learned) total += c.max_seq * c.dim;
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    total += 2 * norm(c) + attention(c);
    total += c.is_moe_layer(layer) ? moe(c, active ? c.moe->top_k : c.moe->num_experts) : mlp(c, c.hidden);
  }
  total += norm(c);                                                    // the final norm
  if (!c.tied_embeddings) total += linear(c, c.dim, c.vocab);          // the output projection
  return total;
}

// Llama 3's hidden sizes follow Meta's rule from (multiple_of, ffn_dim_multiplier).
TransformerConfig llama3(std::string name, int64_t dim, int64_t layers, int64_t heads, int64_t multiple_of, double ffn_dim_multiplier) {
  TransformerConfig c;
  c.name = std::move(name);
  c.vocab = 128256, c.dim = dim, c.layers = layers, c.heads = heads, c.kv_heads = 8;
  c.hidden = swiglu_hidden_size(dim, multiple_of, ffn_dim_multiplier);
  c.max_seq = 131072, c.rope_theta = 500000, c.rope_scaling = RopeScaling{}, c.norm_eps = 1e-5;
  return c;
}

TransformerConfig gpt(std::string name, int64_t vocab, int64_t dim, int64_t layers, int64_t heads, int64_t context) {
  TransformerConfig c;
  c.name = std::move(name);
  c.vocab = vocab, c.dim = dim, c.layers = layers, c.heads = heads, c.kv_heads = heads, c.hidden = 4 * dim, c.max_seq = context;
  c.norm = NormKind::LayerNorm, c.mlp = MlpKind::GELU, c.positions = PositionKind::Learned;
  c.bias = true, c.tied_embeddings = true;
  return c;
}

}  // namespace

int64_t swiglu_hidden_size(int64_t dim, int64_t multiple_of, double ffn_dim_multiplier) {
  if (dim < 1 || multiple_of < 1 || !(ffn_dim_multiplier > 0))
    throw ShapeError("swiglu_hidden_size: dim and multiple_of must be at least 1 and ffn_dim_multiplier positive, got " +
                     std::to_string(dim) + ", " + std::to_string(multiple_of) + ", " + std::to_string(ffn_dim_multiplier));
  // Integer steps as in Meta's model.py: int(2 * 4 dim / 3), int(multiplier * that), round up.
  const int64_t hidden = int64_t(ffn_dim_multiplier * double(2 * 4 * dim / 3));
  return (hidden + multiple_of - 1) / multiple_of * multiple_of;
}

bool TransformerConfig::is_moe_layer(int64_t index) const {
  if (!moe || index < moe->first_dense_layers) return false;
  return (index - moe->first_dense_layers) % moe->every == 0;
}

const TransformerConfig& checked_transformer_config(const TransformerConfig& c) {
  require_positive(c.vocab, "vocab");
  require_positive(c.dim, "dim");
  require_positive(c.layers, "layers");
  require_positive(c.heads, "heads");
  require_positive(c.kv_heads, "kv_heads");
  require_positive(c.hidden, "hidden");
  require_positive(c.max_seq, "max_seq");
  if (c.dim % c.heads != 0)
    throw ShapeError("TransformerConfig: heads " + std::to_string(c.heads) + " does not divide dim " + std::to_string(c.dim));
  if (c.heads % c.kv_heads != 0)
    throw ShapeError("TransformerConfig: kv_heads " + std::to_string(c.kv_heads) + " does not divide heads " + std::to_string(c.heads));
  if (c.moe) {
    const MoEConfig& m = *c.moe;
    require_positive(m.num_experts, "moe.num_experts");
    require_positive(m.top_k, "moe.top_k");
    require_positive(m.expert_hidden, "moe.expert_hidden");
    require_positive(m.every, "moe.every");
    if (!(m.capacity_factor >= 0) || !std::isfinite(m.capacity_factor))
      throw Error("TransformerConfig: moe.capacity_factor must be 0 (dropless) or positive, got " + std::to_string(m.capacity_factor));
    if (!(m.receive_capacity >= 0) || !std::isfinite(m.receive_capacity))
      throw Error("TransformerConfig: moe.receive_capacity must be 0 (the worst case) or a positive multiple of a device's "
                  "assignments, got " + std::to_string(m.receive_capacity));
    if (m.top_k > m.num_experts)
      throw ShapeError("TransformerConfig: moe.top_k " + std::to_string(m.top_k) + " exceeds moe.num_experts " + std::to_string(m.num_experts));
    if (m.num_shared_experts < 0 || m.first_dense_layers < 0)
      throw ShapeError("TransformerConfig: moe.num_shared_experts and moe.first_dense_layers must not be negative");
  }
  return c;
}

std::vector<std::string> transformer_preset_names() {
  return {"llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "deepseek-v3", "gpt2", "gpt3-175b", "llama-tiny", "moe-tiny"};
}

TransformerConfig transformer_preset(std::string_view name) {
  if (name == "llama3-8b") return llama3("llama3-8b", 4096, 32, 32, 1024, 1.3);
  if (name == "llama3-70b") return llama3("llama3-70b", 8192, 80, 64, 4096, 1.3);
  if (name == "llama3-405b") return llama3("llama3-405b", 16384, 126, 128, 4096, 1.2);
  if (name == "mixtral-8x7b") {
    TransformerConfig c = llama3("mixtral-8x7b", 4096, 32, 32, 1024, 1.3);  // hidden 14336
    c.vocab = 32000, c.max_seq = 32768, c.rope_theta = 1e6, c.rope_scaling.reset();
    c.moe = MoEConfig{.num_experts = 8, .top_k = 2, .expert_hidden = 14336};
    return c;
  }
  if (name == "deepseek-v3") {
    TransformerConfig c = llama3("deepseek-v3", 7168, 61, 128, 1, 1.0);
    c.hidden = 18432;  // its dense layers' intermediate_size, not Llama's rule
    c.vocab = 129280, c.kv_heads = 128, c.max_seq = 163840, c.rope_theta = 10000, c.rope_scaling.reset(), c.norm_eps = 1e-6;
    c.moe = MoEConfig{.num_experts = 256, .top_k = 8, .num_shared_experts = 1, .expert_hidden = 2048, .first_dense_layers = 3,
                      .score = RouterScore::Sigmoid, .normalize_top_k = true};
    return c;
  }
  if (name == "gpt2") return gpt("gpt2", 50257, 768, 12, 12, 1024);
  if (name == "gpt3-175b") return gpt("gpt3-175b", 50257, 12288, 96, 96, 2048);
  if (name == "llama-tiny") {
    TransformerConfig c;
    c.name = "llama-tiny", c.vocab = 96, c.dim = 64, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.max_seq = 128;
    c.hidden = swiglu_hidden_size(c.dim, 32);  // 192
    return c;
  }
  if (name == "moe-tiny") {
    TransformerConfig c = transformer_preset("llama-tiny");
    c.name = "moe-tiny";
    c.moe = MoEConfig{.num_experts = 4, .top_k = 2, .num_shared_experts = 1, .expert_hidden = 64, .first_dense_layers = 1};
    return c;
  }
  std::string known;
  for (const std::string& n : transformer_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("transformer_preset: unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

int64_t parameter_count(const TransformerConfig& config) { return count(config, false); }
int64_t active_parameter_count(const TransformerConfig& config) { return count(config, true); }

}  // namespace tessera
