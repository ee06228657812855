#include "nn/gpt.hpp"

#include "dsl/ops.hpp"

namespace tessera {

TransformerConfig gpt_transformer_config(const GptConfig& g) {
  checked_gpt_config(g, "gpt_transformer_config");
  TransformerConfig c;
  c.name = "gpt";
  c.vocab = g.vocab, c.dim = g.width, c.layers = g.layers, c.heads = g.heads, c.kv_heads = g.heads;
  c.hidden = 4 * g.width, c.max_seq = g.context;
  c.norm = NormKind::LayerNorm, c.mlp = MlpKind::GELU, c.positions = PositionKind::Learned;
  c.bias = true, c.tied_embeddings = false;
  c.seed = g.seed, c.activation_checkpointing = g.activation_checkpointing, c.mixed_precision = g.mixed_precision;
  return c;
}

Gpt::Gpt(const GptConfig& config, const Mesh& mesh)
    : Transformer(gpt_transformer_config(checked_gpt_config(config, "Gpt")), mesh, "Gpt"), gpt_config_(config) {}

ParallelizePlan gpt_tensor_parallel_plan(const GptConfig& config, bool sequence_parallel) {
  return transformer_tensor_parallel_plan(gpt_transformer_config(config), sequence_parallel);
}

void distribute_gpt(Gpt& model, const Mesh& mesh, bool sequence_parallel, bool fsdp) {
  distribute_transformer(model, mesh, sequence_parallel, fsdp);
}

// Over [B, T] as it is: merged into [B*T] rows, positions sharded over sp would be gathered.
Tensor gpt_loss(const Tensor& logits, const Tensor& targets) { return cross_entropy(logits, targets); }

}  // namespace tessera
