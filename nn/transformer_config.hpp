// The shape of a decoder-only transformer in the GPT-2 and Llama families, with optional
// mixture-of-experts layers, and the published presets (llama3-8b, mixtral-8x7b, gpt2, ...).
// Plain data: a preset plans a job (parameter counts, memory) without allocating anything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dsl/checkpoint.hpp"
#include "nn/mixed_precision_policy.hpp"

namespace tessera {

enum class NormKind { RMSNorm, LayerNorm };
// SwiGLU: w2(silu(w1 x) * w3 x); GELU: w2(gelu(w1 x)) with GPT-2's tanh approximation.
enum class MlpKind { SwiGLU, GELU };
enum class PositionKind { Rotary, Learned };
enum class RouterScore { Softmax, Sigmoid };

// Llama 3's rotary frequency scaling (the "llama3" rope_scaling of its config.json).
struct RopeScaling {
  double factor = 8, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position = 8192;
};

struct MoEConfig {
  int64_t num_experts = 8;         // routed experts
  int64_t top_k = 2;               // experts per token
  int64_t num_shared_experts = 0;  // run on every token (DeepSeek's)
  int64_t expert_hidden = 0;       // each expert's SwiGLU hidden size
  int64_t first_dense_layers = 0;  // leading layers with a dense MLP (DeepSeek-V3: 3)
  int64_t every = 1;               // after those, every k-th layer is MoE (the others dense)
  RouterScore score = RouterScore::Softmax;
  bool normalize_top_k = false;    // renormalise the top-k weights to sum to 1
  // Under expert parallelism, the rows a device's experts may receive in a step, as a multiple
  // of one device's assignments (tokens x top_k; 1 is perfectly balanced routing). The step's
  // buffers are sized by it. 0: every assignment of every ep peer (ep times; nothing can
  // exceed it). A step whose routing exceeds a smaller capacity stops with an IndexError on
  // every device (dropless: no token is ever dropped); the planner plans with it.
  double receive_capacity = 0;
  // Capacity-factor mode (GShard's and Switch Transformer's), instead of dropless: each expert
  // runs at most ceil(capacity_factor * tokens * top_k / num_experts) of its assignments in a
  // forward (tokens: the whole batch's), first choices before second ones, each in token order;
  // the rest are dropped (they add nothing to their token's output: the residual carries it).
  // Decided on the global routing, so every layout drops the same assignments. 0: dropless.
  double capacity_factor = 0;
  // The balancing loss's weight in the training objective (torchtitan's load_balance_coeff):
  // TransformerTrainingStep adds it times moe_aux_loss() to the loss; pipeline stages add its
  // gradient where each MoE layer runs (PipelinedTransformer).
  double aux_loss_coefficient = 0.01;
};

struct TransformerConfig {
  std::string name;
  int64_t vocab = 256, dim = 64, layers = 2, heads = 4, kv_heads = 4;  // kv_heads < heads: grouped-query
  int64_t hidden = 256;   // the dense MLP's hidden size
  int64_t max_seq = 128;  // the context the positions (or RoPE tables) cover
  NormKind norm = NormKind::RMSNorm;
  MlpKind mlp = MlpKind::SwiGLU;
  PositionKind positions = PositionKind::Rotary;
  double rope_theta = 10000;
  std::optional<RopeScaling> rope_scaling;
  double norm_eps = 1e-5;
  bool bias = false;            // biases on the linears (GPT-2) or none (Llama)
  bool tied_embeddings = false; // the output projection is the embedding table
  std::optional<MoEConfig> moe;

  // Training options of a built Transformer (nn/transformer.hpp), not its shape.
  uint64_t seed = 1;                                        // every parameter's stateless stream
  std::optional<CheckpointPolicy> activation_checkpointing; // of every block; none when empty
  std::optional<MixedPrecisionPolicy> mixed_precision;      // installed by distribute_transformer

  int64_t head_dim() const { return dim / heads; }
  // Whether layer `index` (from 0) has a mixture of experts instead of the dense MLP.
  bool is_moe_layer(int64_t index) const;
};

// Llama's SwiGLU hidden size: 2/3 of 4 dim, times ffn_dim_multiplier, rounded up to a multiple
// of multiple_of (Meta's reference model.py): 4096, 1.3, 1024 -> 14336 (llama3-8b).
int64_t swiglu_hidden_size(int64_t dim, int64_t multiple_of, double ffn_dim_multiplier = 1.0);

// `config` itself when every size is at least 1, heads divides dim, kv_heads divides heads, and
// the MoE fields fit (top_k <= num_experts, ...); otherwise a ShapeError naming the field.
const TransformerConfig& checked_transformer_config(const TransformerConfig& config);

// The published shapes: "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b",
// "deepseek-v3" (its MoE: 256 routed experts and 1 shared, top-8, sigmoid scores, the first 3
// layers dense; its attention modelled as 128 ordinary heads of 128, MLA's compression not
// modelled), "gpt2", "gpt3-175b", and the samples' small ones "llama-tiny", "moe-tiny".
// Error listing the names for an unknown one.
TransformerConfig transformer_preset(std::string_view name);
std::vector<std::string> transformer_preset_names();

// Every parameter (embeddings, attention, MLPs or experts and routers, norms, output).
int64_t parameter_count(const TransformerConfig& config);
// The parameters one token uses: a MoE layer counts its top_k routed experts and the shared ones.
int64_t active_parameter_count(const TransformerConfig& config);

}  // namespace tessera
