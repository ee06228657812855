// The GPT the samples train (GPT-2's layout: pre-norm blocks, LayerNorm, tanh gelu, learned
// positions, biases, an untied head): one configuration of the Transformer of
// nn/transformer.hpp, made from a GptConfig, and the tensor-parallel plan that shards it
// Megatron-style.
#pragma once

#include "nn/gpt_config.hpp"
#include "nn/parallel_styles.hpp"
#include "nn/transformer.hpp"

namespace tessera {

// The TransformerConfig of a GPT: vocab, context (max_seq), layers, width (dim), heads, an MLP
// of 4 x width, and the GptConfig's seed and training options.
TransformerConfig gpt_transformer_config(const GptConfig& config);

// ids [B, T] (int32, T <= context) -> logits [B, T, vocab]. ShapeError for a config
// checked_gpt_config refuses. config() is the GptConfig it was made from (the Transformer's is
// transformer_config()).
class Gpt : public Transformer {
 public:
  Gpt(const GptConfig& config, const Mesh& mesh);
  const GptConfig& config() const { return gpt_config_; }
  const TransformerConfig& transformer_config() const { return Transformer::config(); }

 private:
  GptConfig gpt_config_;
};

// transformer_tensor_parallel_plan of the GPT's TransformerConfig.
ParallelizePlan gpt_tensor_parallel_plan(const GptConfig& config, bool sequence_parallel = false);

// distribute_transformer: Megatron's plan on tp (with its sequence parallelism if asked),
// fully_shard over dp if asked, and the config's mixed precision.
void distribute_gpt(Gpt& model, const Mesh& mesh, bool sequence_parallel, bool fsdp);

// Mean next-token cross entropy of logits [B, T, V] against targets [B, T].
Tensor gpt_loss(const Tensor& logits, const Tensor& targets);

}  // namespace tessera
