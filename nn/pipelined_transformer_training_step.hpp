// A pipelined Transformer's training step as one object, as nn/transformer_training_step.hpp is
// the unpipelined one: a PipelinedTransformer on a mesh with a pp dim (and dp, sp, tp; fully
// sharded over dp and Megatron's sequence parallelism on tp if asked), AdamW, and the jit'd step
// (the schedule's loss and gradients over `microbatches`, clipping at 1.0 block by block,
// AdamW). Without a pp dim it is gradient accumulation over the microbatches. Planning
// (plan/auto_parallelize.hpp) builds it; PipelinedGptTrainingStep is the GPT's.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "jit/jit_function.hpp"
#include "nn/adamw.hpp"
#include "nn/pipelined_transformer.hpp"

namespace tessera {

class PipelinedTransformerTrainingStep {
 public:
  PipelinedTransformerTrainingStep(const TransformerConfig& config, const Mesh& mesh, int64_t microbatches, PipelineSchedule schedule,
                                   bool fsdp = false, bool sequence_parallel = false);
  virtual ~PipelinedTransformerTrainingStep() = default;
  PipelinedTransformerTrainingStep(const PipelinedTransformerTrainingStep&) = delete;
  PipelinedTransformerTrainingStep& operator=(const PipelinedTransformerTrainingStep&) = delete;

  // One step on a batch of token ids and next-token targets [B, T] laid out as
  // TransformerTrainingStep::batch_layout says; returns the loss.
  Tensor operator()(const Tensor& ids, const Tensor& targets) { return step_(ids, targets); }
  // What a step on this batch would cost (defined with the planner: plan/training_step_plans.cpp).
  PlanReport plan(const Tensor& ids, const Tensor& targets);
  PipelinedTransformer& model() { return *model_; }

 protected:
  // `model` already built on `mesh` (a PipelinedGpt, say) for `schedule`; it is distributed here.
  PipelinedTransformerTrainingStep(std::unique_ptr<PipelinedTransformer> model, const Mesh& mesh, int64_t microbatches,
                                   PipelineSchedule schedule, bool fsdp, bool sequence_parallel);

 private:
  using Step = std::function<Tensor(const Tensor&, const Tensor&)>;
  std::unique_ptr<PipelinedTransformer> model_;
  std::vector<Variable> params_;
  AdamW optimizer_;
  JitFunction<Step> step_;
};

// How many virtual stages (model chunks per device) `schedule` runs: 2 for the looped ones, else 1.
int64_t default_virtual_stages(PipelineSchedule schedule);

}  // namespace tessera
