// A Transformer's training step as one object: the model on a mesh, split by the mesh's dims
// (dp: batch, sp: sequence positions, tp: Megatron's plan, with its sequence parallelism if
// asked; ep: the experts of MoE layers; fully sharded over dp if asked), AdamW, and the jit'd step
// (forward, next-token loss plus moe.aux_loss_coefficient (0.01) x the MoE balancing loss where there are MoE layers,
// backward, gradient clipping at 1.0, AdamW). Planning (plan/auto_parallelize.hpp), the benchmarks
// and the tests build the same step from it; GptTrainingStep is the GPT's.
//
// With `microbatches` > 1 it accumulates gradients (torchtitan's gradient_accumulation_steps,
// Megatron's micro-batches without pipelines) as those loops do, on the host: one jit'd program
// runs a microbatch's forward and backward (nn/pipeline.hpp's microbatch(): every dp shard keeps
// its rows; which microbatch is a counter the program reads and advances) and adds its gradients
// into sums kept between calls, written in place (PyTorch's .grad); it runs once per microbatch,
// then a second program clips, steps the optimizer once on the sums, and zeroes them. A device
// holds one microbatch's activations; the sums keep the layouts the gradients are traced in, so
// a sum pending over dp is reduced once a step, not once a microbatch. The loss is the
// microbatches' mean: the one-pass loss, up to rounding. Both programs are compiled and planned
// once whatever the microbatch count (plan/call_sequence_plan.hpp).
#pragma once

#include <functional>
#include <memory>
#include <optional>
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
  Tensor operator()(const Tensor& ids, const Tensor& targets);
  // What a step on this batch would cost (defined with the planner: plan/training_step_plans.cpp).
  PlanReport plan(const Tensor& ids, const Tensor& targets);
  // The same plan's times predicted with `hardware` (a GPU's measured profile, say).
  PlanReport plan(const Hardware& hardware, const Tensor& ids, const Tensor& targets);
  // The program a step runs on this batch: with microbatches, the one each microbatch runs.
  std::shared_ptr<const Executable> executable(const Tensor& ids, const Tensor& targets);

  // How a batch [B, T] is laid out on `mesh`: over dp (and ep, which borrows data-parallel
  // ranks) by sequence, over sp and cp (context parallelism: ring attention) by position.
  static Layout batch_layout(const Mesh& mesh);
  Transformer& model() { return *model_; }

 protected:
  // `model` already built on `mesh` (a Gpt, say); it is distributed here.
  TransformerTrainingStep(std::unique_ptr<Transformer> model, const Mesh& mesh, bool sequence_parallel, bool fsdp, int64_t microbatches);

 private:
  using Step = std::function<Tensor(const Tensor&, const Tensor&)>;
  using Accumulate = std::function<std::vector<Tensor>(const Tensor&, const Tensor&)>;
  using Update = std::function<Tensor()>;
  // The objective of one pass over ids: the next-token loss, plus the MoE balancing loss.
  Tensor objective(const Tensor& ids, const Tensor& targets);
  Tensor step(const Tensor& ids, const Tensor& targets);  // one pass
  // The microbatch the counter names: its objective into the loss sum, its gradients into the
  // gradient sums; the counter moves on.
  void accumulate(const Tensor& ids, const Tensor& targets);
  // The objective of the microbatch `index` names, then its gradients as the backward computes
  // them (gradient_as_computed), one per parameter.
  std::vector<Tensor> microbatch_terms(const Tensor& ids, const Tensor& targets, const Tensor& index);
  Tensor update();  // clip, step the optimizer on the sums, zero them; the mean loss
  // The sums and the counter, zeros in the layouts a microbatch's gradients and objective are
  // traced in (a graph built for its layouts, never run): at the first call or plan.
  void make_sums(const Tensor& ids, const Tensor& targets);
  std::vector<Tensor> parameter_values() const;
  std::unique_ptr<Transformer> model_;
  int64_t microbatches_;
  std::vector<Variable> params_;
  AdamW optimizer_;
  JitFunction<Step> step_;
  std::vector<Variable> gradient_sums_;
  std::optional<Variable> loss_sum_, microbatch_index_;
  JitFunction<Accumulate> accumulate_;
  JitFunction<Update> update_;
};

}  // namespace tessera
