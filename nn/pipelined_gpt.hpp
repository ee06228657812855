// The GPT of nn/gpt.hpp split into pipeline stages (nn/pipeline.hpp) over a mesh's `pp` dim.
//
// The L blocks are split over the P stages by split_blocks (uneven counts allowed: the first
// stages take one more). Slot j of every stage is one StackedGptBlock whose parameters are
// stacked [P, ...] and sharded over pp: stage s's entry is block (first block of s) + j, with
// the very values Gpt gives that block (the same stateless seeds), or zeros where stage s has
// fewer than j + 1 blocks (that slot's output is not used there). On a tp dim the stacked
// weights are split as Megatron's plan splits Gpt's (q, k, v and fc by output column, both
// output projections by input row), so pp composes with dp and tp.
//
// The embeddings, the final layer norm and the head run outside the stages, on every pp device
// (their gradients are summed over pp). With no pp dim the model is one stage: loss() is then
// plain gradient accumulation over the microbatches, bitwise what every pp mesh computes under
// TESSERA_DETERMINISTIC=1.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/gpt.hpp"
#include "nn/pipeline.hpp"

namespace tessera {

// One block position of every stage: x [P, B, T, C] -> [P, B, T, C], stage s with its own weights.
class StackedGptBlock : public Module {
 public:
  // blocks[s]: the GPT block stage s runs in this slot, or -1 for none.
  StackedGptBlock(const GptConfig& config, const Mesh& mesh, const std::vector<int64_t>& blocks, const std::string& mesh_dim);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;

 private:
  int64_t heads_;
};

class PipelinedGpt : public Module {
 public:
  PipelinedGpt(const GptConfig& config, const Mesh& mesh, std::string mesh_dim = "pp");
  // ids [B, T] -> logits [B, T, vocab], the batch as one microbatch through the stages.
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override;
  // The mean over `microbatches` microbatches (nn/pipeline.hpp's microbatch()) of each one's
  // mean next-token cross entropy, through the GPipe schedule.
  Tensor loss(const Tensor& ids, const Tensor& targets, int64_t microbatches);

  // The squared 2-norms (f64 scalars) of `grads` (one per parameters() entry) taken block by
  // block in Gpt's parameter order, so a clipped step is the same whatever the stage count.
  std::vector<Tensor> gradient_squares(const std::vector<Tensor>& grads) const;

  const GptConfig& config() const { return config_; }
  int64_t stages() const { return int64_t(stage_blocks_.size()); }
  const std::vector<int64_t>& stage_blocks() const { return stage_blocks_; }  // blocks per stage

 private:
  Tensor embed(const Tensor& ids);  // [B, T] -> [B, T, C]
  Tensor stages_forward(const Tensor& stacked);
  std::vector<Tensor> run_stages(const Tensor& ids, int64_t microbatches);

  GptConfig config_;
  Mesh mesh_;
  std::string mesh_dim_;
  std::vector<int64_t> stage_blocks_;
  std::shared_ptr<Embedding> tokens_, positions_;
  std::vector<std::shared_ptr<StackedGptBlock>> slots_;
  std::shared_ptr<LayerNorm> ln_f_;
  std::shared_ptr<Dense> head_;
};

}  // namespace tessera
