// A decoder-only transformer built from a TransformerConfig (nn/transformer_config.hpp): the
// GPT-2 family (LayerNorm, learned positions, GELU MLP, biases) and the Llama family (RMSNorm,
// rotary embeddings, grouped-query attention, SwiGLU, no biases) are two configurations of it.
// Modules and parameters carry torchtitan's names, so its parallelize plans read the same:
//   tok_embeddings, pos_embeddings (learned positions only),
//   layers.<i>.{attention_norm, attention.{wq, wk, wv, wo}, ffn_norm, feed_forward.{w1, w2, w3}},
//   norm, output (absent when the embeddings are tied).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dsl/mesh.hpp"
#include "nn/module.hpp"
#include "nn/module_list.hpp"
#include "nn/moe.hpp"
#include "nn/parallel_styles.hpp"
#include "nn/rotary.hpp"
#include "nn/transformer_config.hpp"

namespace tessera {

// Causal self-attention with n_kv_heads <= n_heads: wq [dim, heads * head_dim], wk and wv
// [dim, kv_heads * head_dim], each kv head shared by heads / kv_heads query heads. Inputs: x
// [B, T, dim], and for rotary configs the tables' cos and sin (nn/rotary.hpp).
class Attention : public Module {
 public:
  Attention(const TransformerConfig& config, const Mesh& mesh, uint64_t seed);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;

 private:
  int64_t heads_, kv_heads_;
  bool rotary_;
};

// Attention's core on projections with any leading axes (the pipeline's stacked stages have one
// more): q [..., T, heads * head_dim], k and v [..., T, kv_heads * head_dim] ->
// [..., T, heads * head_dim], causal. Rotary configs rotate q and k by `rotary`; each kv head
// serves heads / kv_heads consecutive query heads; on a mesh with a "cp" dim of size > 1 it runs
// as ring attention (dsl/ring_attention.hpp).
Tensor causal_self_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads, int64_t kv_heads,
                             const std::optional<RotaryTables>& rotary);

// The dense MLP: SwiGLU w2(silu(w1 x) * w3 x), or GELU w2(gelu(w1 x)).
class FeedForward : public Module {
 public:
  FeedForward(const TransformerConfig& config, int64_t hidden, const Mesh& mesh, uint64_t seed);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;

 private:
  MlpKind kind_;
};

// Pre-norm block: h = x + attention(attention_norm(x)); h + feed_forward(ffn_norm(h)). Inputs
// as Attention's.
// A MoE layer (config.is_moe_layer) has "moe" (nn/moe.hpp) in place of "feed_forward".
class TransformerBlock : public Module {
 public:
  TransformerBlock(const TransformerConfig& config, int64_t layer, const Mesh& mesh);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  MoE* moe() const { return moe_.get(); }  // null for a dense layer

 private:
  std::shared_ptr<MoE> moe_;
};

// ids [B, T] (int32, T <= max_seq) -> logits [B, T, vocab]. Parameters start replicated on
// `mesh`, drawn from stateless streams of config.seed: the same values on any mesh.
class Transformer : public Module {
 public:
  Transformer(const TransformerConfig& config, const Mesh& mesh);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  const TransformerConfig& config() const { return config_; }
  // The MoE layers, in order, and the sum of their load-balancing losses from the last forward
  // (add a coefficient times it to the training loss; Error for a model without MoE layers).
  std::vector<MoE*> moe_layers() const;
  Tensor moe_aux_loss() const;
  // `who` names the model in errors ("Gpt" for the GPT of nn/gpt.hpp, "PipelinedGpt" for the
  // one whose stages take their initial weights from it).
  Transformer(const TransformerConfig& config, const Mesh& mesh, std::string who);

 private:
  TransformerConfig config_;
  std::string who_;
  std::shared_ptr<Module> tok_embeddings_, pos_embeddings_, norm_, output_;
  std::shared_ptr<ModuleList> layers_;
};

// Megatron's plan with torchtitan's names: per block wq/wk/wv and w1/w3 ColwiseParallel (whole
// heads per device where tp divides kv_heads), wo and w2 RowwiseParallel; the token embedding
// vocabulary-parallel; the output ColwiseParallel with its logits left vocabulary-sharded for a
// loss-parallel cross_entropy (tied embeddings give the same from the sharded table).
// sequence_parallel: the norms run SequenceParallel on sequence shards, the row-parallel outputs
// reduce_scatter into Shard(1), and attention and feed_forward gather their input once.
ParallelizePlan transformer_tensor_parallel_plan(const TransformerConfig& config, bool sequence_parallel = false);

// The plan above over the mesh's tp dim (if any), expert parallelism over its ep dim (if any),
// fully_shard over dp if asked, and the config's mixed precision. Error for fsdp without a dp dim, or sequence parallelism without a tp dim.
void distribute_transformer(Transformer& model, const Mesh& mesh, bool sequence_parallel, bool fsdp);

}  // namespace tessera
