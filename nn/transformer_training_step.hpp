// A Transformer's training step as one object: the model on a mesh, split by the mesh's dims
// (dp: batch, sp: sequence positions, tp: Megatron's plan, with its sequence parallelism if
// asked; ep: the experts of MoE layers; fully sharded over dp if asked), AdamW, and the jit'd step
// (forward, next-token loss plus moe.aux_loss_coefficient (0.01) x the MoE balancing loss where there are MoE layers,
// backward, gradient clipping at 1.0, AdamW). Planning (plan/auto_parallelize.hpp), the benchmarks
// and the tests build the same step from it; GptTrainingStep is the GPT's.
//
// With `microbatches` > 1 it accumulates gradients (torchtitan's gradient_accumulation_steps,
// Megatron's micro-batches without pipelines): the batch is cut into that many microbatches
// (nn/pipeline.hpp's microbatch(): every dp shard keeps its rows), each runs its forward and
// backward in turn (ProgramOrderScope), so a device holds one microbatch's activations, the
// gradient terms are added in microbatch order, and the optimizer steps once on their sum. The
// loss is the microbatches' mean: the one-pass loss, up to rounding.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "jit/jit_function.hpp"
#include "nn/adamw.hpp"
#include "nn/transformer.hpp"

namespace tessera {

class TransformerTrainingStep {
 public:
  TransformerTrainingStep(const TransformerConfig& config, const Mesh& mesh, bool sequence_parallel = false, bool fsdp = false,
                          int64_t microbatches = 1);
  virtual ~TransformerTrainingStep() = default;
  TransformerTrainingStep(const TransformerTrainingStep&) = delete;
  TransformerTrainingStep& operator=(const TransformerTrainingStep&) = delete;

  // One step on a batch of token ids and next-token targets [B, T]; returns the loss.
  Tensor operator()(const Tensor& ids, const Tensor& targets) { return step_(ids, targets); }
  // What a step on this batch would cost (defined with the planner: plan/training_step_plans.cpp).
  PlanReport plan(const Tensor& ids, const Tensor& targets);
  // The same plan's times predicted with `hardware` (a GPU's measured profile, say).
  PlanReport plan(const Hardware& hardware, const Tensor& ids, const Tensor& targets);
  std::shared_ptr<const Executable> executable(const Tensor& ids, const Tensor& targets) { return step_.executable(ids, targets); }

  // How a batch [B, T] is laid out on `mesh`: over dp (and ep, which borrows data-parallel
  // ranks) by sequence, over sp and cp (context parallelism: ring attention) by position.
  static Layout batch_layout(const Mesh& mesh);
  Transformer& model() { return *model_; }

 protected:
  // `model` already built on `mesh` (a Gpt, say); it is distributed here.
  TransformerTrainingStep(std::unique_ptr<Transformer> model, const Mesh& mesh, bool sequence_parallel, bool fsdp, int64_t microbatches);

 private:
  using Step = std::function<Tensor(const Tensor&, const Tensor&)>;
  // The objective of one pass over ids: the next-token loss, plus the MoE balancing loss.
  Tensor objective(const Tensor& ids, const Tensor& targets);
  Tensor step(const Tensor& ids, const Tensor& targets);
  std::unique_ptr<Transformer> model_;
  int64_t microbatches_;
  std::vector<Variable> params_;
  AdamW optimizer_;
  JitFunction<Step> step_;
};

}  // namespace tessera
