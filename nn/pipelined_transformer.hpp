// A Transformer (nn/transformer.hpp: the GPT-2 and Llama families) split into pipeline stages
// (nn/pipeline.hpp) over a mesh's `pp` dim.
//
// The L blocks are split over P V chunks by split_blocks (uneven counts allowed: the first
// chunks take one more), chunk v P + s being device s's virtual stage v (V = 1 but for the
// looped schedules). Slot j of every chunk is one StackedTransformerBlock whose parameters are
// stacked [P V, ...] and sharded over pp: a chunk's entry is its first block + j, with the very
// values the Transformer gives that block (the same stateless seeds: the stacked entries are
// taken from a Transformer built with the same config), or zeros where the chunk has fewer
// than j + 1 blocks (that slot's output is not used there). Names follow the Transformer's:
// slot<j>.{attention_norm, attention.{wq, wk, wv, wo}, ffn_norm, feed_forward.{w1, w2, w3}}.
// On a tp dim the stacked weights are split as Megatron's plan splits the Transformer's (wq, wk,
// wv, w1 and w3 by output column, wo and w2 by input row), so pp composes with dp and tp.
//
// The embeddings, the final norm and the output projection run outside the stages, on every pp
// device (their gradients are summed over pp). distribute_pipelined_transformer adds
// fully_shard over dp and mixed precision; an sp dim splits the sequence as for the Transformer.
// With no pp dim the model is one stage: loss() is then plain gradient accumulation over the
// microbatches, bitwise what every pp mesh computes under TESSERA_DETERMINISTIC=1.
//
// MoE layers run in stages too. Every stage's tokens go through one dispatch: the stages'
// experts are stacked [P V, E, ...] like any weight, and the tokens of the P stages are routed
// each within its own stage's E experts, so ep composes with pp as with dp (all_to_all_v within
// each stage's ep group). A slot whose chunks hold a dense layer on some devices and a MoE layer
// on others (DeepSeek-V3's first dense layers) holds both and selects per device. Each MoE
// layer's balancing loss enters the objective where the layer runs, as Megatron's pipelines do
// it (its gradient, aux_loss_coefficient / microbatches per microbatch, added in the layer's
// backward; the loss reported is the cross entropy alone). The auxiliary-loss-free bias is
// updated from each layer's loads over the step's microbatches (update_expert_bias).
//
// A cp dim splits the sequence as TransformerTrainingStep::batch_layout does, and every stage's
// attention runs as ring attention over it (dsl/ring_attention.hpp), the stage axis kept split.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.hpp"
#include "nn/pipeline.hpp"
#include "nn/pipeline_tick_loop.hpp"
#include "nn/rotary.hpp"
#include "nn/transformer_config.hpp"

namespace tessera {

// What the stacked layers of one model share while a step is traced (pipelined_transformer.cpp).
struct StageContext;

class PipelinedTransformer : public Module {
 public:
  // virtual_stages > 1: V chunks per device for the looped schedules (chunk v P + s on device
  // s), which need at least P V blocks.
  PipelinedTransformer(const TransformerConfig& config, const Mesh& mesh, int64_t virtual_stages = 1, std::string mesh_dim = "pp");
  // ids [B, T] -> logits [B, T, vocab], the batch as one microbatch through the stages.
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  // The mean over `microbatches` microbatches (nn/pipeline.hpp's microbatch()) of each one's
  // mean next-token cross entropy, through the GPipe schedule.
  Tensor loss(const Tensor& ids, const Tensor& targets, int64_t microbatches);
  // That loss and its gradients (one per parameters() entry) under `schedule`: autodiff through
  // loss() for gpipe and looped-bfs, run_pipeline_1f1b for 1f1b and interleaved-1f1b (the
  // looped ones need virtual stages, the others one).
  std::pair<Tensor, std::vector<Tensor>> loss_and_gradients(const Tensor& ids, const Tensor& targets, int64_t microbatches,
                                                           PipelineSchedule schedule);

  // The model as 1F1B's host loop runs it on a batch (nn/pipeline_tick_loop.hpp): its parts,
  // each microbatch chosen at run time. Error for virtual stages or MoE layers (whose balancing
  // weighs the stages busy at a tick, which the loop's programs know only at run time).
  PipelineTickModel tick_model(const Tensor& ids, const Tensor& targets, int64_t microbatches);
  // The parameters by part, as 1F1B splits them: the embeddings (first), the slots (stages), the
  // final norm and output (last; with tied embeddings the table once more, last of all).
  PipelineLoss parameter_parts() const;
  // One gradient per parameters() entry from 1F1B's gradients by part (parameter_parts' order):
  // a tied table's gradient is its two parts' sum.
  std::vector<Tensor> joined_gradients(const PipelineGradients& parts) const;

  // The squared 2-norms (f64 scalars) of `grads` (one per parameters() entry) taken block by
  // block in the Transformer's parameter order, so a clipped step is the same whatever the
  // stage count.
  std::vector<Tensor> gradient_squares(const std::vector<Tensor>& grads) const;

  // Megatron's sequence parallelism on the mesh's tp dim (distribute_pipelined_transformer): the
  // activations between layers, and those the stages hand on, split by position over tp; a
  // column split gathers them, a row split's sum is scattered back (a reduce_scatter in place of
  // an all_reduce). Error without a tp dim.
  void use_sequence_parallelism();

  // DeepSeek-V3's auxiliary-loss-free balancing (MoE::update_expert_bias's rule) for the MoE
  // layers in stages: each layer's bias += rate * sign(mean load - load), its load being the
  // tokens each of its experts received over the microbatches of the last traced loss. In a
  // jit'd step, after loss_and_gradients, as an optimizer's update. Error for a model without
  // MoE layers, or before any loss.
  void update_expert_bias(double rate);
  // The expert bias (f32 [E]) of MoE layer `layer`; Error for a dense layer.
  Tensor expert_bias(int64_t layer) const;

  const TransformerConfig& transformer_config() const { return config_; }
  int64_t stages() const;
  int64_t virtual_stages() const;
  // Blocks per chunk, chunk v P + s being device s's virtual stage v.
  const std::vector<int64_t>& chunk_blocks() const { return chunk_blocks_; }

 protected:
  // `who` names the model in errors ("PipelinedGpt" for nn/pipelined_gpt.hpp's).
  PipelinedTransformer(const TransformerConfig& config, const Mesh& mesh, int64_t virtual_stages, std::string mesh_dim, std::string who);

 private:
  Tensor embed(const Tensor& ids);  // [B, T] -> [B, T, dim]
  Tensor stages_forward(const Tensor& stacked, int64_t tick, const std::vector<PipelineSlot>& slots);
  std::vector<Tensor> run_stages(const Tensor& ids, int64_t microbatches);
  PipelineSpec spec(const Tensor& ids, int64_t microbatches);
  Tensor logits(const Tensor& last_output);  // the final norm, the output, the policy's output dtype

  TransformerConfig config_;
  std::string who_;
  std::shared_ptr<StageContext> context_;
  std::vector<int64_t> chunk_blocks_;
  std::shared_ptr<Module> tok_embeddings_, pos_embeddings_, norm_, output_;
  std::vector<std::shared_ptr<Module>> slots_;  // one block position of every chunk (pipelined_transformer.cpp)
};

// The parallelism distribute_transformer adds to a Transformer that the stacked layers do not
// have already (they are split over pp and tp as built): fully_shard over dp if asked (each
// stacked parameter's rows split further over dp, gathered before use), the config's mixed
// precision (given to fully_shard, else applied to the whole model), and Megatron's sequence
// parallelism on tp if asked. Error for fsdp without a dp dim, sequence parallelism without a tp dim.
void distribute_pipelined_transformer(PipelinedTransformer& model, const Mesh& mesh, bool fsdp, bool sequence_parallel = false);

}  // namespace tessera
