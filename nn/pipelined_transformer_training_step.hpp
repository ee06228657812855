// A pipelined Transformer's training step as one object, as nn/transformer_training_step.hpp is
// the unpipelined one: a PipelinedTransformer on a mesh with a pp dim (and dp, sp, tp; fully
// sharded over dp and Megatron's sequence parallelism on tp if asked), AdamW, and the jit'd step
// (the schedule's loss and gradients over `microbatches`, clipping at 1.0 block by block,
// AdamW). Without a pp dim it is gradient accumulation over the microbatches. Planning
// (plan/auto_parallelize.hpp) builds it; PipelinedGptTrainingStep is the GPT's.
//
// 1F1B on a pp dim runs as a host loop (nn/pipeline_tick_loop.hpp): warm-up, steady and
// cool-down tick programs, called P - 1, M and P - 1 times, then an update program that clips,
// steps AdamW on the gradient sums and zeroes them. Each program is compiled and planned once
// whatever the microbatch count (plan/call_sequence_plan.hpp). The other schedules, and 1F1B
// over MoE layers, run the whole step as one program.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "jit/jit_function.hpp"
#include "nn/adamw.hpp"
#include "nn/pipeline_tick_loop.hpp"
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
  Tensor operator()(const Tensor& ids, const Tensor& targets);
  // What a step on this batch would cost (defined with the planner: plan/training_step_plans.cpp).
  PlanReport plan(const Tensor& ids, const Tensor& targets);
  PipelinedTransformer& model() { return *model_; }

 protected:
  // `model` already built on `mesh` (a PipelinedGpt, say) for `schedule`; it is distributed here.
  PipelinedTransformerTrainingStep(std::unique_ptr<PipelinedTransformer> model, const Mesh& mesh, int64_t microbatches,
                                   PipelineSchedule schedule, bool fsdp, bool sequence_parallel);

 private:
  using Step = std::function<Tensor(const Tensor&, const Tensor&)>;
  using TickCall = std::function<std::vector<Tensor>(const Tensor&, const Tensor&)>;
  using Update = std::function<Tensor()>;
  TickCall tick_call(PipelineTickPhase phase);
  Tensor update();  // the host loop's last program: clip, AdamW on the sums, zero them; the mean loss
  JitFunction<TickCall>& tick_program(PipelineTickPhase phase);
  std::unique_ptr<PipelinedTransformer> model_;
  int64_t microbatches_;
  std::vector<Variable> params_;
  AdamW optimizer_;
  JitFunction<Step> step_;
  std::optional<PipelineTickLoop> loop_;  // 1F1B over several stages
  JitFunction<TickCall> warm_up_, steady_, cool_down_;
  JitFunction<Update> update_;
};

// How many virtual stages (model chunks per device) `schedule` runs: 2 for the looped ones, else 1.
int64_t default_virtual_stages(PipelineSchedule schedule);

}  // namespace tessera
