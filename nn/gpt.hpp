// A GPT (decoder-only transformer, GPT-2's layout: pre-norm blocks, tanh gelu, learned
// positions) built from nn/ layers, and the tensor-parallel plan that shards it Megatron-style.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "dsl/checkpoint.hpp"

#include "nn/dense.hpp"
#include "nn/gpt_config.hpp"
#include "nn/layers.hpp"
#include "nn/mixed_precision.hpp"
#include "nn/parallel_styles.hpp"

namespace tessera {

// Causal multi-head self-attention: q, k, v and the output projection are Dense layers; heads
// are split from the width, so ColwiseParallel q/k/v puts whole heads on each device.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const GptConfig& config, const Mesh& mesh, uint64_t seed);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;  // [B, T, C] -> [B, T, C]

 private:
  int64_t heads_;
  std::shared_ptr<Dense> q_, k_, v_, proj_;
};

class GptBlock : public Module {
 public:
  GptBlock(const GptConfig& config, const Mesh& mesh, uint64_t seed);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;

 private:
  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<Dense> fc_, proj_;
};

// ids [B, T] (int32, T <= context) -> logits [B, T, vocab]. ShapeError for a config
// checked_gpt_config refuses.
class Gpt : public Module {
 public:
  Gpt(const GptConfig& config, const Mesh& mesh);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  const GptConfig& config() const { return config_; }

 private:
  GptConfig config_;
  std::shared_ptr<Embedding> tokens_, positions_;
  std::vector<std::shared_ptr<GptBlock>> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
  std::shared_ptr<Dense> head_;
};

// Megatron's plan: per block, q/k/v and fc ColwiseParallel, attention and MLP output projections
// RowwiseParallel; the token embedding vocabulary-parallel (RowwiseParallel), the head
// ColwiseParallel with its logits left vocabulary-sharded for a loss-parallel cross_entropy.
// sequence_parallel adds Megatron's sequence parallelism (PyTorch's tensor-parallel tutorial
// plan): the layer norms run SequenceParallel on sequence shards, the embedding and the output
// projections leave Shard(1), and each attention's input is gathered by PrepareModuleInput.
ParallelizePlan gpt_tensor_parallel_plan(const GptConfig& config, bool sequence_parallel = false);

// Splits `model` over the mesh's dims as the GPT sample does: Megatron's plan on tp (with its
// sequence parallelism if asked), fully_shard over dp if asked, and the config's mixed precision
// (given to fully_shard, else applied to the whole model). Error for --fsdp without a dp dim or
// sequence parallelism without a tp dim.
void distribute_gpt(Gpt& model, const Mesh& mesh, bool sequence_parallel, bool fsdp);

// Mean next-token cross entropy of logits [B, T, V] against targets [B, T].
Tensor gpt_loss(const Tensor& logits, const Tensor& targets);

}  // namespace tessera
