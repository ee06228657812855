// The GPT sample's pipelined training step as one object, as nn/gpt_training_step.hpp is the
// unpipelined one: a PipelinedGpt on a mesh with a pp dim (and dp, sp, tp; fully sharded over dp
// and Megatron's sequence parallelism on tp if asked), AdamW, and the jit'd step (the schedule's loss and gradients over `microbatches`,
// clipping at 1.0 block by block, AdamW). Planning (nn/auto_parallelize.hpp) builds it.
#pragma once

#include <functional>
#include <vector>

#include "jit/jit_function.hpp"
#include "nn/adamw.hpp"
#include "nn/pipelined_gpt.hpp"

namespace tessera {

class PipelinedGptTrainingStep {
 public:
  PipelinedGptTrainingStep(const GptConfig& config, const Mesh& mesh, int64_t microbatches, PipelineSchedule schedule, bool fsdp = false,
                           bool sequence_parallel = false);
  PipelinedGptTrainingStep(const PipelinedGptTrainingStep&) = delete;
  PipelinedGptTrainingStep& operator=(const PipelinedGptTrainingStep&) = delete;

  // One step on a batch of token ids and next-token targets [B, T] laid out as
  // GptTrainingStep::batch_layout says; returns the loss.
  Tensor operator()(const Tensor& ids, const Tensor& targets) { return step_(ids, targets); }
  PlanReport plan(const Tensor& ids, const Tensor& targets) { return step_.plan(ids, targets); }
  PipelinedGpt& model() { return model_; }

 private:
  using Step = std::function<Tensor(const Tensor&, const Tensor&)>;
  PipelinedGpt model_;
  std::vector<Variable> params_;
  AdamW optimizer_;
  JitFunction<Step> step_;
};

}  // namespace tessera
