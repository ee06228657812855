// The GPT of nn/gpt.hpp split into pipeline stages (nn/pipeline.hpp) over a mesh's `pp` dim.
//
// The L blocks are split over P V chunks by split_blocks (uneven counts allowed: the first
// chunks take one more), chunk v P + s being device s's virtual stage v (V = 1 but for the
// looped-bfs schedule). Slot j of every chunk is one StackedGptBlock whose parameters are
// stacked [P V, ...] and sharded over pp: a chunk's entry is its first block + j, with the very
// values Gpt gives that block (the same stateless seeds), or zeros where the chunk has fewer
// than j + 1 blocks (that slot's output is not used there). On a tp dim the stacked
// weights are split as Megatron's plan splits Gpt's (q, k, v and fc by output column, both
// output projections by input row), so pp composes with dp and tp.
//
// The embeddings, the final layer norm and the head run outside the stages, on every pp device
// (their gradients are summed over pp). distribute_pipelined_gpt adds fully_shard over dp and
// mixed precision; an sp dim splits the sequence as for Gpt. With no pp dim the model is one stage: loss() is then
// plain gradient accumulation over the microbatches, bitwise what every pp mesh computes under
// TESSERA_DETERMINISTIC=1.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/dense.hpp"
#include "nn/gpt.hpp"
#include "nn/layers.hpp"
#include "nn/pipeline.hpp"

namespace tessera {

// What the stacked layers of one PipelinedGpt share: the mesh, its pp dim, the stage and
// virtual stage counts, and which virtual stage each device runs at the tick being traced.
struct StageContext {
  Mesh mesh;
  std::string mesh_dim;
  int64_t stages = 1, virtual_stages = 1;
  bool sequence_parallel = false;      // Megatron's, on tp: activations between layers split by position
  int64_t tick = 0;                    // the tick being traced
  std::vector<int64_t> virtual_stage;  // per device, this tick
};

// One block position of every chunk: x [P, B, T, C] -> [P, B, T, C], device s with the weights of
// the virtual stage it runs this tick. Parameters are stacked [P V, ...], row s V + v.
class StackedGptBlock : public Module {
 public:
  // blocks[s V + v]: the GPT block device s's virtual stage v runs in this slot, or -1 for none.
  StackedGptBlock(const GptConfig& config, const std::shared_ptr<const StageContext>& context, const std::vector<int64_t>& blocks);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
};

class PipelinedGpt : public Module {
 public:
  // virtual_stages > 1: V chunks per device for the looped-bfs schedule (chunk v P + s on device
  // s), which needs at least P V blocks.
  PipelinedGpt(const GptConfig& config, const Mesh& mesh, int64_t virtual_stages = 1, std::string mesh_dim = "pp");
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

  // The squared 2-norms (f64 scalars) of `grads` (one per parameters() entry) taken block by
  // block in Gpt's parameter order, so a clipped step is the same whatever the stage count.
  std::vector<Tensor> gradient_squares(const std::vector<Tensor>& grads) const;

  // Megatron's sequence parallelism on the mesh's tp dim (distribute_pipelined_gpt): the
  // activations between layers, and those the stages hand on, split by position over tp; a
  // column split gathers them, a row split's sum is scattered back (a reduce_scatter in place of
  // an all_reduce). Error without a tp dim.
  void use_sequence_parallelism();

  const GptConfig& config() const { return config_; }
  int64_t stages() const { return context_->stages; }
  int64_t virtual_stages() const { return context_->virtual_stages; }
  // Blocks per chunk, chunk v P + s being device s's virtual stage v.
  const std::vector<int64_t>& chunk_blocks() const { return chunk_blocks_; }

 private:
  Tensor embed(const Tensor& ids);  // [B, T] -> [B, T, C]
  Tensor stages_forward(const Tensor& stacked, int64_t tick, const std::vector<int64_t>& virtual_stage);
  std::vector<Tensor> run_stages(const Tensor& ids, int64_t microbatches);
  PipelineSpec spec(const Tensor& ids, int64_t microbatches);
  Tensor logits(const Tensor& last_output);  // ln_f, head, the policy's output dtype

  GptConfig config_;
  std::shared_ptr<StageContext> context_;
  std::vector<int64_t> chunk_blocks_;
  std::shared_ptr<Embedding> tokens_, positions_;
  std::vector<std::shared_ptr<StackedGptBlock>> slots_;
  std::shared_ptr<LayerNorm> ln_f_;
  std::shared_ptr<Dense> head_;
};

// The parallelism distribute_gpt adds to Gpt that the stacked layers do not have already (they
// are split over pp and tp as built): fully_shard over dp if asked (each stacked parameter's
// rows split further over dp, gathered before use), and the config's mixed precision (given to
// fully_shard, else applied to the whole model), and Megatron's sequence parallelism on tp if
// asked. Error for fsdp without a dp dim, sequence parallelism without a tp dim.
void distribute_pipelined_gpt(PipelinedGpt& model, const Mesh& mesh, bool fsdp, bool sequence_parallel = false);

}  // namespace tessera
